"""``global_batch_size``: the world reads G rows a step whatever its size, through 3 -> 2 -> 3.

Loaders over Parquet files written with pyarrow (no Spark), made by the converter the ranks
get: each simulated rank has its own loader, and the ranks step in lockstep, as DDP makes
them. A change of the world happens in process (``on_world_change`` on the loaders that live
on, a new rank's loader from ``state_dict``) or by relaunch (every loader new, from
``state_dict``). Each step: the ranks' shares add up to G (the last step: what is left),
differ by one row at most, and the weighted losses averaged over the ranks (what DDP does)
give the mean over the step's rows. Over the epoch every row is read once and the steps
number ``ceil(N / G)``, as in a world that never changed.
"""

from __future__ import annotations

import logging
import math
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkdist.data.converter import SparkDatasetConverter
from sparkdist.data.layout import describe

ROW_GROUPS = [[700, 300], [1000], [250, 5, 45]]
N_ROWS = 2300
G = 121  # over 3 ranks: 41, 40, 40 rows a step; the last step (1 row) gives 2 ranks a pad
LOADER = {"num_epochs": 1, "shuffle": True, "seed": 7, "pad_column": "is_pad", "prefetch": 0}


@pytest.fixture(scope="module")
def groups_converter(tmp_path_factory) -> SparkDatasetConverter:
    directory = tmp_path_factory.mktemp("global-batch")
    first = 0
    for index, groups in enumerate(ROW_GROUPS):
        ids = np.arange(first, first + sum(groups), dtype=np.int64)
        table = pa.table({"id": ids, "loss": np.sin(ids) * 3.0 + ids / 100.0})
        with pq.ParquetWriter(directory / f"part-{index}.parquet", table.schema) as writer:
            start = 0
            for size in groups:
                writer.write_table(table.slice(start, size), row_group_size=size)
                start += size
        first += len(ids)
    return SparkDatasetConverter(None, describe(directory.as_uri()), source="parquet")


def as_numpy(batch: dict) -> dict:
    return {name: np.asarray(values) for name, values in batch.items()}


def run_steps(iterators: list, steps: int | None, record: list) -> None:
    """Step the ranks in lockstep ``steps`` times (None: to the end), checking each step."""
    world = len(iterators)
    while steps is None or steps > 0:
        batches = [next(it, None) for it in iterators]
        if all(batch is None for batch in batches):
            return
        assert all(batch is not None for batch in batches), "the ranks' step counts differ"
        batches = [as_numpy(batch) for batch in batches]
        sizes = [len(batch["id"]) for batch in batches]
        assert max(sizes) - min(sizes) <= 1 or any(b["is_pad"].any() for b in batches)
        real = [batch["id"][~batch["is_pad"]] for batch in batches]
        rows = sum(len(ids) for ids in real)
        # Each rank's loss: sum of per-row losses times the weights; DDP averages the ranks.
        ddp = sum(float((b["loss"] * b["row_weight"]).sum()) for b in batches) / world
        full_batch = np.concatenate([b["loss"][~b["is_pad"]] for b in batches]).mean()
        assert ddp == pytest.approx(full_batch, rel=1e-5)
        for batch in batches:
            assert (batch["row_weight"][batch["is_pad"]] == 0).all()
        record.append((world, rows, np.concatenate(real)))
        steps = None if steps is None else steps - 1


def check_epoch(record: list) -> None:
    counts = Counter(np.concatenate([ids for _, _, ids in record]).tolist())
    assert sorted(counts) == list(range(N_ROWS)) and max(counts.values()) == 1
    assert len(record) == math.ceil(N_ROWS / G)  # the step count of a world that never changed
    assert [rows for _, rows, _ in record[:-1]] == [G] * (len(record) - 1)
    assert record[-1][1] == N_ROWS - G * (len(record) - 1)
    assert record[-1][1] == 1  # N = 19 G + 1: two ranks read a pad in the last step
    assert [world for world, _, _ in record[:4]] == [3, 3, 3, 3]


def test_global_batch_through_3_2_3_in_process(groups_converter, caplog):
    record: list = []
    with caplog.at_level(logging.INFO, logger="sparkdist.data"):
        contexts = [
            groups_converter.make_numpy_batches(
                global_batch_size=G, cur_shard=r, shard_count=3, **LOADER
            )
            for r in range(3)
        ]
    assert "ranks 0..0 read 41 rows a step, ranks 1..2 read 40" in caplog.text
    loaders = [context.__enter__() for context in contexts]
    assert [len(loader) for loader in loaders] == [math.ceil(N_ROWS / G)] * 3
    run_steps([iter(loader) for loader in loaders], 4, record)
    # Rank 2 is lost; ranks 0 and 1 live on from the committed position (any rank's).
    state = loaders[0].state_dict()
    assert state["rows_consumed"] == 4 * G
    survivors = loaders[:2]
    for rank, loader in enumerate(survivors):
        loader.load_state_dict(state)
        loader.on_world_change(rank, 2)
    assert [len(loader) for loader in survivors] == [math.ceil(N_ROWS / G) - 4] * 2
    run_steps([iter(loader) for loader in survivors], 7, record)
    # A third rank joins: it loads the world's position; the others take their new place.
    state = survivors[0].state_dict()
    joined = groups_converter.make_numpy_batches(
        global_batch_size=G, cur_shard=2, shard_count=3, **LOADER
    )
    newcomer = joined.__enter__()
    newcomer.load_state_dict(state)
    for rank, loader in enumerate(survivors):
        loader.on_world_change(rank, 3)
    run_steps([iter(loader) for loader in [*survivors, newcomer]], None, record)
    assert [world for world, _, _ in record[4:11]] == [2] * 7 and record[11][0] == 3
    check_epoch(record)


def test_global_batch_through_3_2_3_by_relaunch_torch(groups_converter):
    record: list = []
    state = None
    for world, steps in ((3, 5), (2, 6), (3, None)):
        loaders = []
        for rank in range(world):
            loader = groups_converter.make_torch_dataloader(
                global_batch_size=G, cur_shard=rank, shard_count=world, **LOADER
            ).__enter__()
            if state is not None:
                loader.load_state_dict(state)
            loaders.append(loader)
        run_steps([iter(loader) for loader in loaders], steps, record)
        states = [loader.state_dict() for loader in loaders]
        assert all(s == states[0] for s in states)  # any rank's position is the world's
        state = states[0]
    check_epoch(record)
    assert state["epoch"] == 1 and state["rows_consumed"] == 0


@pytest.mark.parametrize("drop_last", [False, True])
def test_global_batch_with_decode_workers_and_tf(groups_converter, drop_last):
    """The torch loader's DataLoader workers and tf.data read the same rows as numpy."""
    pytest.importorskip("tensorflow")
    options = {**LOADER, "global_batch_size": 7, "drop_last": drop_last, "shard_count": 2}
    for rank in range(2):
        with groups_converter.make_numpy_batches(cur_shard=rank, **options) as numpy_batches:
            expected = [as_numpy(batch) for batch in numpy_batches]
        with groups_converter.make_torch_dataloader(
            cur_shard=rank, num_workers=2, **options
        ) as loader:
            got = [as_numpy(batch) for batch in loader]
        with groups_converter.make_tf_dataset(cur_shard=rank, **options) as dataset:
            from_tf = [{k: v.numpy() for k, v in b._asdict().items()} for b in dataset]
        for other in (got, from_tf):
            assert len(other) == len(expected)
            for a, b in zip(expected, other, strict=True):
                np.testing.assert_array_equal(a["id"], b["id"])
                np.testing.assert_allclose(a["row_weight"], b["row_weight"])
        sizes = {len(batch["id"]) for batch in expected[:-1]}
        assert sizes == {4 if rank == 0 else 3}
        if drop_last:
            assert len(expected) == N_ROWS // 7


def test_bad_global_batch_is_refused_early(groups_converter):
    with pytest.raises(ValueError, match="smaller than the world"):
        groups_converter.make_numpy_batches(global_batch_size=2, cur_shard=0, shard_count=3)
    with pytest.raises(ValueError, match="at least 1"):
        groups_converter.make_numpy_batches(global_batch_size=0, cur_shard=0, shard_count=1)
    with groups_converter.make_numpy_batches(
        global_batch_size=4, cur_shard=0, shard_count=2
    ) as batches:
        with pytest.raises(ValueError, match="smaller than the world"):
            batches.on_world_change(0, 5)
    with pytest.raises(ValueError, match="is a column of the data"):
        groups_converter.make_numpy_batches(
            global_batch_size=4, cur_shard=0, shard_count=2, weight_column="loss"
        )
