"""``pad_column=``: the rows an epoch repeats for equal steps are marked in every batch.

Equal steps pad each rank's slice as torch's DistributedSampler does (the first rows of
the epoch's order, read again). A metric sharded over the ranks must leave them out:
with ``pad_column="is_pad"`` each batch carries a boolean column, True on those rows,
so the unmarked rows of all ranks are every row of the epoch exactly once.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

N_ROWS = 1001


def converter_frame(spark):
    """The rows of this module's `converter` (tests/helpers.py)."""
    return spark.range(N_ROWS).selectExpr("id", "id % 2 = 0 as even").repartition(4)


def marked(converter, kind: str, rank: int, world: int, **kwargs) -> list[tuple[int, bool]]:
    """(id, is_pad) of every row rank ``rank`` of ``world`` reads, with ``kind``'s loader."""
    kwargs = {"batch_size": 64, "num_epochs": 1, "pad_column": "is_pad", **kwargs}
    out = []
    if kind == "numpy":
        with converter.make_numpy_batches(cur_shard=rank, shard_count=world, **kwargs) as batches:
            for batch in batches:
                assert batch["is_pad"].dtype == np.bool_
                out += zip(batch["id"].tolist(), batch["is_pad"].tolist(), strict=True)
    elif kind == "torch":
        import torch

        with converter.make_torch_dataloader(cur_shard=rank, shard_count=world, **kwargs) as loader:
            for batch in loader:
                assert batch["is_pad"].dtype == torch.bool  # a mask, also beside uint8 booleans
                out += zip(batch["id"].tolist(), batch["is_pad"].tolist(), strict=True)
    else:
        import tensorflow as tf

        with converter.make_tf_dataset(cur_shard=rank, shard_count=world, **kwargs) as dataset:
            assert dataset.element_spec.is_pad.dtype == tf.bool
            for batch in dataset:
                out += zip(batch.id.numpy().tolist(), batch.is_pad.numpy().tolist(), strict=True)
    return out


def check_each_row_once(per_rank: list[list[tuple[int, bool]]], rows: int = N_ROWS) -> None:
    assert len({len(rank_rows) for rank_rows in per_rank}) == 1  # equal steps
    kept = Counter(i for rank_rows in per_rank for i, pad in rank_rows if not pad)
    assert sorted(kept) == list(range(rows)) and set(kept.values()) == {1}


@pytest.mark.parametrize("kind", ["numpy", "torch", "tf"])
@pytest.mark.parametrize("world", [2, 3, 5, 16])
def test_unmarked_rows_are_each_row_once(converter, kind, world):
    per_rank = [marked(converter, kind, rank, world, shuffle=True, seed=4) for rank in range(world)]
    check_each_row_once(per_rank)
    pads = sum(pad for rank_rows in per_rank for _, pad in rank_rows)
    assert pads == -(-N_ROWS // world) * world - N_ROWS
    # The columns of the data are untouched: only the marker is added.
    everything = Counter(i for rank_rows in per_rank for i, _ in rank_rows)
    assert sum(everything.values()) == N_ROWS + pads


def test_marks_survive_decode_workers_threads_and_two_epochs(converter):
    plain = [marked(converter, "torch", rank, 3, num_epochs=2) for rank in range(3)]
    processes = [
        marked(converter, "torch", rank, 3, num_epochs=2, num_workers=2, workers_count=2)
        for rank in range(3)
    ]
    assert processes == plain
    each = len(plain[0]) // 2
    for epoch in range(2):
        check_each_row_once([rows[epoch * each : (epoch + 1) * each] for rows in plain])


def test_drop_last_reads_no_pads(converter):
    per_rank = [marked(converter, "numpy", rank, 3, drop_last=True) for rank in range(3)]
    assert not any(pad for rank_rows in per_rank for _, pad in rank_rows)
    assert [len(rank_rows) for rank_rows in per_rank] == [N_ROWS // 3] * 3


def test_marks_after_a_resume_in_a_smaller_world(converter):
    """3 ranks read 3 batches, 2 ranks read the rest: the unmarked rows are each row once."""
    kwargs = {"batch_size": 50, "num_epochs": 1, "shuffle": True, "seed": 8, "pad_column": "is_pad"}
    first, state = [], None
    for rank in range(3):
        with converter.make_numpy_batches(cur_shard=rank, shard_count=3, **kwargs) as batches:
            for batch in itertools.islice(batches, 3):
                first += zip(batch["id"].tolist(), batch["is_pad"].tolist(), strict=True)
            state = batches.state_dict()
    rest = []
    for rank in range(2):
        with converter.make_numpy_batches(cur_shard=rank, shard_count=2, **kwargs) as batches:
            batches.load_state_dict(state)
            rest.append(
                [
                    pair
                    for b in batches
                    for pair in zip(b["id"].tolist(), b["is_pad"].tolist(), strict=True)
                ]
            )
    assert not any(pad for _, pad in first)  # pads come at the end of an epoch only
    assert sum(pad for rank_rows in rest for _, pad in rank_rows) == 1  # 551 rows for 2 ranks
    kept = Counter(i for i, pad in first + rest[0] + rest[1] if not pad)
    assert sorted(kept) == list(range(N_ROWS)) and set(kept.values()) == {1}


def test_pad_column_must_be_a_new_name(converter):
    with pytest.raises(ValueError, match="pad_column 'even' is a column of the data"):
        converter.make_numpy_batches(batch_size=8, pad_column="even")
