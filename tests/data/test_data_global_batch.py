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

import contextlib
import logging
import math
import os
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkdist import HorovodRunner
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


def check_shares(batches: list[dict]) -> None:
    """One step's batches, one a rank: their lengths differ by one row at most, and so do
    their real rows; a pad is read only by a rank that has no real row left in the last
    step, alone in its batch, with weight 0 (`GlobalSplit`)."""
    sizes = [len(batch["id"]) for batch in batches]
    reals = [int((~batch["is_pad"]).sum()) for batch in batches]
    assert max(sizes) - min(sizes) <= 1, sizes
    assert max(reals) - min(reals) <= 1, reals
    for batch, real in zip(batches, reals, strict=True):
        if batch["is_pad"].any():
            assert real == 0 and len(batch["id"]) == 1, batch
            assert (batch["row_weight"][batch["is_pad"]] == 0).all(), batch


def run_steps(iterators: list, steps: int | None, record: list) -> None:
    """Step the ranks in lockstep ``steps`` times (None: to the end), checking each step."""
    world = len(iterators)
    while steps is None or steps > 0:
        batches = [next(it, None) for it in iterators]
        if all(batch is None for batch in batches):
            return
        assert all(batch is not None for batch in batches), "the ranks' step counts differ"
        batches = [as_numpy(batch) for batch in batches]
        check_shares(batches)
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


@pytest.mark.parametrize("device", [None, "cpu"])  # "cpu": through the device feed's ring
def test_global_batch_through_3_2_3_by_relaunch_torch(groups_converter, device):
    record: list = []
    state = None
    for world, steps in ((3, 5), (2, 6), (3, None)):
        loaders = []
        for rank in range(world):
            on = {"device": device, "device_feed": "ring"} if device else {}
            loader = groups_converter.make_torch_dataloader(
                global_batch_size=G, cur_shard=rank, shard_count=world, **on, **LOADER
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


GENERATIONS = [([0, 1, 2], 4), ([0, 1], 7), ([0, 1, 2], None)]
"""The worlds of the real ranks' job: their members (launch ranks) and steps each."""


def global_batch_ranks(train, store: str) -> list:
    """A rank of a 3 -> 2 -> 3 world in real processes, over gloo, reading G rows a step.

    Launch rank 2 is lost after generation 0 (its loader goes with it) and comes back, a
    newcomer with a fresh loader, in generation 2. Each generation RANK / WORLD_SIZE are
    set, a group is formed, the world's position is broadcast from world rank 0 (as
    `elastic.run` does) and the loaders follow the environment. Each step: each rank's
    loss is its rows' losses times their weights, summed; all_reduce averages them over
    the ranks, as DDP averages gradients; the step's rows are gathered to compare. Launch
    rank 0 (world rank 0 throughout) returns each committed step: its generation, world
    size, the averaged loss, the mean loss of the step's real rows, and each rank's ids,
    pads and weights."""
    import datetime

    import torch.distributed as dist

    launch = int(os.environ["RANK"])
    steps_seen, commit = [], None
    with contextlib.ExitStack() as stack:
        loader = None
        for generation, (members, steps) in enumerate(GENERATIONS):
            if launch not in members:
                stack.close()  # this rank is lost: its loader goes with it
                loader = None
                continue
            rank, world = members.index(launch), len(members)
            os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
            dist.init_process_group(
                "gloo",
                init_method=f"file://{store}/generation-{generation}",
                rank=rank,
                world_size=world,
                timeout=datetime.timedelta(seconds=120),
            )
            if loader is None:  # a newcomer: its shard comes from the environment
                opened = train.make_torch_dataloader(global_batch_size=G, **LOADER)
                loader = stack.enter_context(opened)
            if commit is not None:  # a restore: the step after the commit is redone
                loader.load_state_dict(commit)
            state = [loader.state_dict()]
            dist.broadcast_object_list(state, src=0)  # the position comes from a survivor
            loader.load_state_dict(state[0])
            step = 0
            for batch in loader:
                weighted = (batch["loss"].double() * batch["row_weight"].double()).sum()
                dist.all_reduce(weighted)  # the ranks' losses, summed: DDP then divides
                mine = {k: batch[k].tolist() for k in ("id", "is_pad", "loss", "row_weight")}
                gathered, positions = [None] * world, [None] * world
                dist.all_gather_object(gathered, mine)
                dist.all_gather_object(positions, loader.state_dict())
                assert all(position == positions[0] for position in positions)
                commit = positions[0]
                real = [
                    loss
                    for part in gathered
                    for loss, pad in zip(part["loss"], part["is_pad"], strict=True)
                    if not pad
                ]
                averaged = weighted.item() / world
                steps_seen.append((generation, world, averaged, sum(real) / len(real), gathered))
                step += 1
                if step == steps:
                    break
            if generation == 0 and launch in GENERATIONS[1][0]:
                next(iter(loader))  # a step that fails: it is not committed
            dist.destroy_process_group()
    return steps_seen if launch == 0 else []


def test_global_batch_through_3_2_3_in_real_ranks_over_gloo(groups_converter, tmp_path):
    """`global_batch_size` in rank processes of a job (np=-3): through 3 -> 2 -> 3, each
    step's loss averaged over the ranks by a real all_reduce is the step's full-batch
    mean, every row is read once, and each step keeps the bound on the ranks' shares."""
    results = HorovodRunner(np=-3, launcher="direct").run_all(
        global_batch_ranks, train=groups_converter, store=str(tmp_path)
    )
    steps = results[0]
    worlds = [world for _, world, _, _, _ in steps]
    assert worlds == [3] * 4 + [2] * 7 + [3] * (len(steps) - 11), worlds
    assert len(steps) == math.ceil(N_ROWS / G)  # the step count of a world that never changed
    read = []
    for generation, world, averaged, full_batch, gathered in steps:
        assert averaged == pytest.approx(full_batch, rel=1e-6), (generation, averaged)
        batches = [{k: np.asarray(v) for k, v in part.items()} for part in gathered]
        assert len(batches) == world
        check_shares(batches)
        read += [i for b in batches for i in b["id"][~b["is_pad"]].tolist()]
    counts = Counter(read)
    assert sorted(counts) == list(range(N_ROWS)) and set(counts.values()) == {1}
    reals = [sum(int((~np.asarray(p["is_pad"])).sum()) for p in g) for *_, g in steps]
    assert reals == [G] * (len(steps) - 1) + [N_ROWS - G * (len(steps) - 1)]


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
