"""``rank_split="per_step"``: step ``s`` of a global batch reads the same rows in any world.

The default split gives each rank one contiguous part of what is left of the epoch, so
after a change of the world's size step ``s`` reads other rows than a run that never
changed (the chaos soak's finding, docs/benchmarks.md). Per step, step ``s`` reads
positions ``[s*G, (s+1)*G)`` of what is left of the epoch's global order, rank ``r`` the
``r``-th part (`order.shares`), so the world's size changes only who reads a row, not when.
First the pure logic of `sparkdist.data.rank.order` (seeded, resized, padded, a property
test), then the real loaders over Parquet files written with pyarrow (no Spark).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sparkdist.data.converter import SparkDatasetConverter
from sparkdist.data.layout import describe
from sparkdist.data.rank import order

LAYOUT = [[700, 300], [1000], [250, 5, 45]]
N_ROWS = 2300
G = 121  # N = 19 G + 1: over 3 ranks the last step (1 row) gives ranks 1 and 2 a pad
WINDOW = 256


def read_steps(layout, seed, global_batch, worlds, cuts, drop_last, shuffle=True, split="per_step"):
    """An epoch read by ``worlds`` in turn, each for its ``cuts`` steps (None: to the end),
    resumed through ``state_dict`` / ``load_state_dict``: each step's real rows (file-order
    ids, rank 0's then rank 1's ...), and the state after the last world's steps."""
    n = sum(map(sum, layout))
    epoch_order = order.EpochOrder(layout, seed, 0, shuffle, WINDOW)
    steps, state = [], None
    for world, cut in zip(worlds, cuts, strict=True):
        positions = [
            order.Position(
                n, seed, rank, world, 1, drop_last, global_batch_size=global_batch, rank_split=split
            )
            for rank in range(world)
        ]
        for position in positions:
            if state is not None:
                position.load_state_dict(state)
        in_epoch = positions[0].batches_in_epoch()
        done = in_epoch if cut is None else min(cut, in_epoch)
        ranks = []
        for position in positions:
            share, own, rows = position.rank_batch_size(), position.own_rows(), position.slice()
            # Equal steps: a rank's slice is its steps' rows, and a pad if the last gives it none.
            pad = in_epoch > 0 and own == (in_epoch - 1) * share
            assert order.total(rows) == own + pad
            bounds = [(s * share, min((s + 1) * share, own)) for s in range(done)]
            ranks.append(
                [epoch_order.row_ids(order.take(rows, lo, max(lo, hi))) for lo, hi in bounds]
            )
            position.batches = done
        steps += [np.concatenate([rank[s] for rank in ranks]) for s in range(done)]
        states = [position.state_dict() for position in positions]
        assert all(s == states[0] for s in states)  # any rank's state is the world's
        state = states[0]
        if done == in_epoch:  # the epoch is read: the next worlds have nothing left of it
            break
    return steps, state


def expected_steps(layout, seed, global_batch, drop_last, shuffle=True):
    """Step ``s`` of the epoch: positions ``[s*G, (s+1)*G)`` of its global order."""
    n = sum(map(sum, layout))
    sequence = order.EpochOrder(layout, seed, 0, shuffle, WINDOW).row_ids([(0, n)])
    stop = n - n % global_batch if drop_last else n
    return [sequence[s : min(s + global_batch, stop)] for s in range(0, stop, global_batch)]


def same_steps(got, wanted) -> bool:
    return len(got) == len(wanted) and all(
        np.array_equal(a, b) for a, b in zip(got, wanted, strict=True)
    )


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_step_reads_the_same_rows_in_worlds_of_1_2_3_and_5(shuffle):
    wanted = expected_steps(LAYOUT, 7, G, False, shuffle)
    one, _ = read_steps(LAYOUT, 7, G, [1], [None], False, shuffle)
    assert same_steps(one, wanted)
    for world in (2, 3, 5):
        steps, state = read_steps(LAYOUT, 7, G, [world], [None], False, shuffle)
        assert same_steps(steps, one), world  # the rows, and their order: rank 0's first
        assert state["epoch"] == 1 and state["rows_consumed"] == 0
    # The default split reads other rows a step once the world has more than one rank.
    contiguous, _ = read_steps(LAYOUT, 7, G, [3], [None], False, shuffle, split="contiguous")
    assert not same_steps(contiguous, one)
    assert sorted(np.concatenate(contiguous)) == list(range(N_ROWS))


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_resize_3_2_3_reads_the_steps_of_a_world_that_never_changed(drop_last):
    unresized, _ = read_steps(LAYOUT, 3, G, [3], [None], drop_last)
    steps, state = read_steps(LAYOUT, 3, G, [3, 2, 3], [4, 7, None], drop_last)
    assert same_steps(steps, unresized)
    assert same_steps(steps, expected_steps(LAYOUT, 3, G, drop_last))
    counts = Counter(np.concatenate(steps).tolist())
    assert max(counts.values()) == 1
    assert len(counts) == (N_ROWS - N_ROWS % G if drop_last else N_ROWS)
    assert state["epoch"] == 1 and state["rows_consumed"] == 0
    # Mid-epoch the position is a cut of the order, the same whoever saved it.
    _, state_3 = read_steps(LAYOUT, 3, G, [3, 3], [6, 0], drop_last)
    _, state_2 = read_steps(LAYOUT, 3, G, [2, 5], [6, 0], drop_last)
    assert state_3 == state_2 and state_3["remaining"] == [[6 * G, N_ROWS]]


def test_the_last_step_pads_and_drop_last_leaves_the_tail():
    """N = 19 G + 1 over 3 ranks: the 20th step is one row, rank 0's; ranks 1 and 2 read
    one pad each, the first row of what was left; ``drop_last`` has 19 steps instead."""
    n = N_ROWS
    positions = [
        order.Position(n, 3, r, 3, 1, global_batch_size=G, rank_split="per_step") for r in range(3)
    ]
    assert [p.batches_in_epoch() for p in positions] == [20] * 3
    assert [p.own_rows() for p in positions] == [19 * 41 + 1, 19 * 40, 19 * 40]
    for rank, position in enumerate(positions):
        rows = position.slice()
        offset = [0, 41, 81][rank]
        assert order.take(rows, 0, order.total(rows))[0] == (offset, offset + [41, 40, 40][rank])
        assert order.take(rows, 19 * position.rank_batch_size(), n) == (
            [(n - 1, n)] if rank == 0 else [(0, 1)]  # the last row, or a pad
        )
    weights = order.global_weights(positions[1])
    assert weights == (3 / G, 3.0)  # a pad weighs 0 (the plan marks it past `real`)
    dropped = order.Position(n, 3, 2, 3, 1, True, global_batch_size=G, rank_split="per_step")
    assert dropped.batches_in_epoch() == 19 and order.total(dropped.slice()) == 19 * 40
    dropped.batches = 19
    assert dropped.state_dict()["epoch"] == 1  # the tail row waits for no step


def test_the_decode_workers_of_a_rank_share_its_steps():
    """DataLoader's worker ``w`` of ``k`` reads the rank's batches ``w, w + k, ...``: its
    rows of a per-step slice are those steps' parts, and the workers cover the slice."""
    position = order.Position(N_ROWS, 3, 1, 3, 1, global_batch_size=G, rank_split="per_step")
    rows, share = position.slice(), position.rank_batch_size()
    for before in (0, 1):
        parts = [order.wanted_intervals(rows, share, w, 2, before) for w in range(2)]
        for worker, part in enumerate(parts):
            first = (worker - before) % 2
            wanted = [order.take(rows, s * share, (s + 1) * share) for s in range(first, 20, 2)]
            assert part == [interval for step in wanted for interval in step]
        assert sum(order.total(part) for part in parts) == order.total(rows)


def test_the_split_is_checked():
    with pytest.raises(ValueError, match="give global_batch_size too"):
        order.Position(10, 0, 0, 1, 4, rank_split="per_step")
    with pytest.raises(ValueError, match="rank_split must be one of"):
        order.Position(10, 0, 0, 1, 4, global_batch_size=4, rank_split="steps")


@settings(max_examples=150, deadline=None)
@given(
    layout=st.lists(st.lists(st.integers(0, 120), min_size=1, max_size=4), min_size=1, max_size=4),
    worlds=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 6), min_size=3, max_size=3),
    extra=st.integers(0, 50),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_any_resize_history_reads_the_unresized_steps(
    layout, worlds, cuts, extra, drop_last, shuffle, seed
):
    global_batch = max(worlds) + extra
    assume(sum(map(sum, layout)) >= (global_batch if drop_last else 1))  # an epoch of steps
    history = (worlds, [*cuts[: len(worlds) - 1], None])
    steps, state = read_steps(layout, seed, global_batch, *history, drop_last, shuffle)
    assert same_steps(steps, expected_steps(layout, seed, global_batch, drop_last, shuffle))
    assert state["epoch"] == 1 and state["rows_consumed"] == 0


def take_one_by_one(intervals, ranges):
    """`order.take_many` as a loop over the positions: the reference."""
    sequence = [(p, i) for i, (start, stop) in enumerate(intervals) for p in range(start, stop)]
    out = []
    for lo, hi in ranges:
        for p, i in sequence[lo:hi]:
            if out and out[-1][1] == p and out[-1][2] == (lo, hi, i):
                out[-1][1] = p + 1
            else:
                out.append([p, p + 1, (lo, hi, i)])
    return [(start, stop) for start, stop, _ in out]


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), max_size=6),
    gaps=st.lists(st.integers(0, 5), min_size=6, max_size=6),
    cuts=st.lists(st.integers(0, 200), max_size=12),
    batch_size=st.integers(1, 20),
    workers=st.integers(1, 4),
    before=st.integers(0, 5),
)
def test_take_many_and_worker_rows_are_the_loops_they_replace(
    lengths, gaps, cuts, batch_size, workers, before
):
    """Pieces of the sequence the intervals make, one a range and an interval (a range across
    intervals gives one of each); a worker's share of a slice's first rows, counted."""
    intervals, start = [], 0
    for length, gap in zip(lengths, gaps, strict=False):
        start += gap
        intervals.append((start, start + length))
        start += length
    points = sorted(set(cuts))
    ranges = list(zip(points[::2], points[1::2], strict=False))
    assert order.take_many(intervals, ranges) == take_one_by_one(intervals, ranges)
    rows = order.total(intervals)
    for worker in range(workers):
        for first in (0, rows // 2, rows):
            listed = order.wanted_intervals([(0, first)], batch_size, worker, workers, before)
            counted = order.worker_rows(first, batch_size, worker, workers, before)
            assert counted == order.total(listed)


# -- through the real loaders --


@pytest.fixture(scope="module")
def converter(tmp_path_factory) -> SparkDatasetConverter:
    directory = tmp_path_factory.mktemp("per-step")
    first = 0
    for index, groups in enumerate(LAYOUT):
        ids = np.arange(first, first + sum(groups), dtype=np.int64)
        table = pa.table({"id": ids, "loss": np.sin(ids) * 3.0 + ids / 100.0})
        with pq.ParquetWriter(directory / f"part-{index}.parquet", table.schema) as writer:
            start = 0
            for size in groups:
                writer.write_table(table.slice(start, size), row_group_size=size)
                start += size
        first += len(ids)
    return SparkDatasetConverter(None, describe(directory.as_uri()), source="parquet")


LOADER = {
    "num_epochs": 1,
    "seed": 7,
    "pad_column": "is_pad",
    "global_batch_size": G,
    "rank_split": "per_step",
    "shuffle_buffer_rows": WINDOW,
}


def lockstep(loaders: list, steps: int | None = None) -> list:
    """Step the ranks' loaders together (None: to the end): each step's real ids, rank 0's
    first, after checking that the weighted losses DDP averages give the step's mean."""
    record, iterators = [], [iter(loader) for loader in loaders]
    while steps is None or len(record) < steps:
        batches = [next(it, None) for it in iterators]
        if all(batch is None for batch in batches):
            break
        batches = [{name: np.asarray(values) for name, values in b.items()} for b in batches]
        real = [b["id"][b["is_pad"] == 0] for b in batches]
        ddp = sum(float((b["loss"] * b["row_weight"]).sum()) for b in batches) / len(batches)
        mean = np.concatenate([b["loss"][b["is_pad"] == 0] for b in batches]).mean()
        assert ddp == pytest.approx(mean, rel=1e-5)
        record.append(np.concatenate(real))
    return record


def numpy_loaders(converter, world: int, **options) -> list:
    return [
        converter.make_numpy_batches(
            cur_shard=r, shard_count=world, **LOADER, **options
        ).__enter__()
        for r in range(world)
    ]


@pytest.mark.parametrize("shuffle", [True, False])
def test_loaders_read_the_same_steps_in_any_world(converter, shuffle):
    """Numpy batches in worlds of 1, 2, 3 and 5 ranks, and torch loaders of 3 ranks with two
    decode workers each: step ``s`` reads the same rows, the 1-rank run's, in order."""
    wanted = expected_steps(converter.layout.row_group_rows, 7, G, False, shuffle)
    for world in (1, 2, 3, 5):
        assert same_steps(lockstep(numpy_loaders(converter, world, shuffle=shuffle)), wanted)
    torch_loaders = [
        converter.make_torch_dataloader(
            cur_shard=r, shard_count=3, shuffle=shuffle, num_workers=2, **LOADER
        ).__enter__()
        for r in range(3)
    ]
    assert same_steps(lockstep(torch_loaders), wanted)


def test_loaders_resized_3_2_3_read_the_unresized_steps(converter):
    """In process: rank 2 is lost after 4 steps, a newcomer joins after 7 more."""
    unresized = lockstep(numpy_loaders(converter, 3, shuffle=True))
    loaders = numpy_loaders(converter, 3, shuffle=True)
    record = lockstep(loaders, 4)
    state = loaders[0].state_dict()
    survivors = loaders[:2]
    for rank, loader in enumerate(survivors):
        loader.load_state_dict(state)
        loader.on_world_change(rank, 2)
    record += lockstep(survivors, 7)
    newcomer = numpy_loaders(converter, 3, shuffle=True)[2]
    newcomer.load_state_dict(survivors[0].state_dict())
    for rank, loader in enumerate(survivors):
        loader.on_world_change(rank, 3)
    record += lockstep([*survivors, newcomer])
    assert same_steps(record, unresized) and len(record) == 20
    assert sorted(np.concatenate(record).tolist()) == list(range(N_ROWS))
