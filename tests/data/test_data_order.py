"""The epoch's global order, its equal split across ranks, and resuming in any world size.

Pure logic (sparkdist.data.rank.order), checked over many seeded random layouts, world sizes,
batch sizes and resize histories; the readers on real Spark data are in test_data.py and
tests/runner/test_runner_data.py.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from sparkdist.data.rank import order


def random_layout(rng: np.random.Generator) -> list[list[int]]:
    files = int(rng.integers(1, 6))
    return [list(rng.integers(0, 300, size=int(rng.integers(1, 5)))) for _ in range(files)]


@pytest.mark.parametrize("shuffle", [False, True])
def test_global_order_is_a_permutation_independent_of_world_size(shuffle):
    layout = [[150, 150, 100], [700], [0, 401, 500]]
    n = 2001
    first = order.EpochOrder(layout, seed=11, epoch=0, shuffle=shuffle, window_rows=400)
    sequence = first.row_ids([(0, n)])
    assert sorted(sequence) == list(range(n))
    if shuffle:
        assert list(sequence) != list(range(n))
        other_epoch = order.EpochOrder(layout, seed=11, epoch=1, shuffle=True, window_rows=400)
        assert list(other_epoch.row_ids([(0, n)])) != list(sequence)
    for world in (2, 3):
        slices = [order.rank_slice([(0, n)], r, world, drop_last=False) for r in range(world)]
        assert len({order.total(s) for s in slices}) == 1  # equal steps
        read = np.concatenate([first.row_ids(s) for s in slices])
        # The world reads the same global sequence, whatever its size; the tail is padding
        # repeated from the start of the order.
        assert list(read[:n]) == list(sequence)
        assert list(read[n:]) == list(sequence[: len(read) - n])


def simulate_epoch(layout, seed, batch_size, worlds, steps, drop_last):
    """Read one epoch in worlds of the given sizes, each stopped after its steps."""
    n = sum(map(sum, layout))
    epoch_order = order.EpochOrder(layout, seed=seed, epoch=2, shuffle=True, window_rows=256)
    state = None
    reads, padded = [], 0
    for world, limit in zip(worlds, steps, strict=True):
        positions = []
        for rank in range(world):
            position = order.Position(n, seed, rank, world, batch_size, drop_last, epoch=2)
            if state is not None:
                position.load_state_dict(state)
            positions.append(position)
        size = order.total(positions[0].remaining)
        each = order.slice_rows(size, world, drop_last)
        batches = positions[0].batches_in_epoch()
        assert all(p.batches_in_epoch() == batches for p in positions)  # equal steps
        done = batches if limit is None else min(limit, batches)
        for rank, position in enumerate(positions):
            rows = min(done * batch_size, each)
            part = order.take(position.slice(), 0, rows)
            reads.extend(epoch_order.row_ids(part).tolist())
            real = max(0, min(size, (rank + 1) * each) - rank * each)
            padded += max(0, rows - real)
            position.batches = done
        states = [position.state_dict() for position in positions]
        assert all(s == states[0] for s in states)  # any rank's state is the world's
        state = states[0]
        if done == batches:
            assert state["epoch"] == 3 and state["rows_consumed"] == 0
            return n, reads, padded
    raise AssertionError("the last world must finish the epoch")


@pytest.mark.parametrize("case", range(150))
def test_resuming_in_any_world_reads_each_row_once(case):
    rng = np.random.default_rng(case)
    layout = random_layout(rng)
    if sum(map(sum, layout)) == 0:
        layout[0][0] = 1
    resizes = int(rng.integers(0, 4))
    worlds = [int(w) for w in rng.integers(1, 6, size=resizes + 1)]
    steps = [int(s) for s in rng.integers(0, 8, size=resizes)] + [None]
    drop_last = bool(rng.integers(0, 2))
    batch_size = int(rng.integers(1, 120))
    n, reads, padded = simulate_epoch(layout, case, batch_size, worlds, steps, drop_last)
    counts = Counter(reads)
    if drop_last:
        assert max(counts.values()) == 1  # never a row twice
        assert n - len(counts) <= sum(w - 1 for w in worlds)  # each world drops < its size
    else:
        assert sorted(counts) == list(range(n))  # every row of the epoch
        assert len(reads) - n == padded  # the only repeats are the pads


def test_shrink_and_grow_mid_epoch():
    """3 ranks read 4 steps, 2 ranks 3 steps, then 3 ranks finish: each row once."""
    layout = [[100] * 10, [33]]
    n, reads, padded = simulate_epoch(layout, 5, 10, [3, 2, 3], [4, 3, None], False)
    assert sorted(Counter(reads)) == list(range(n))
    assert len(reads) == n + padded and padded < 3


def test_state_is_small_and_checked():
    position = order.Position(10_000_000, 1, 0, 64, 256)
    position.batches = 7
    state = position.state_dict()
    assert state["rows_consumed"] == 7 * 256 * 64
    assert len(repr(state)) < 4096
    other = order.Position(10, 1, 0, 2, 4)
    with pytest.raises(ValueError, match="same converted data"):
        other.load_state_dict(state)


def test_shuffled_order_is_close_to_a_true_permutation():
    """The bounds docs/data.md quotes: inside a window a row's place is as uncorrelated with
    its place in the files as in a true permutation, and next rows in the files almost never
    share a batch; over the epoch the correlation is that of the windows' random order."""
    layout, n, batch = [[2000] * 16] * 4, 128_000, 256
    for seed in range(4):
        epoch_order = order.EpochOrder(layout, seed, 0, True, 8192)
        measure = order.randomness(epoch_order.row_ids([(0, n)]), batch)
        assert measure["neighbours"] < 2 * batch / 8192  # in the files' order: ~1
        assert abs(measure["spearman"]) < 0.3  # 16 windows in a random order
        for window in epoch_order.windows:
            inside = order.randomness(epoch_order.permutation(window), batch)
            assert abs(inside["spearman"]) < 5 / np.sqrt(window.rows)  # a true permutation's
    in_order = order.EpochOrder(layout, 0, 0, False).row_ids([(0, n)])
    expected = {"spearman": 1, "neighbours": 1}
    assert order.randomness(in_order, batch) == pytest.approx(expected, abs=0.01)


@pytest.mark.parametrize("case", range(100))
def test_a_global_batch_survives_any_resize_history(case):
    """With ``global_batch_size`` every step is G rows for the world, shares differ by one
    at most, and resizes leave each row read once and the epoch's step count unchanged."""
    rng = np.random.default_rng(case)
    layout = random_layout(rng)
    layout[0][0] = max(layout[0][0], 1)
    n, drop_last = sum(map(sum, layout)), bool(rng.integers(0, 2))
    worlds = [int(w) for w in rng.integers(1, 6, size=int(rng.integers(1, 4)))]
    global_batch = int(rng.integers(max(worlds), 60))
    split = order.global_split(n, 1, global_batch, drop_last)
    state, reads, steps_taken = None, [], 0
    for index, world in enumerate(worlds):
        last = index == len(worlds) - 1
        positions = [
            order.Position(n, case, r, world, 1, drop_last, global_batch_size=global_batch)
            for r in range(world)
        ]
        for position in positions:
            if state is not None:
                position.load_state_dict(state)
        steps = positions[0].batches_in_epoch()
        done = steps if last else min(int(rng.integers(0, 5)), steps)
        for position in positions:
            share = position.rank_batch_size()
            assert share in order.shares(global_batch, world)
            rows = order.take(position.slice(), 0, min(done * share, position.own_rows()))
            reads.extend(order.EpochOrder(layout, case, 0).row_ids(rows).tolist())
            position.batches = done
        steps_taken += done
        state = positions[0].state_dict()
        if done == steps:
            break
    assert steps_taken == split.steps  # the epoch's step count, whatever the worlds
    counts = Counter(reads)
    assert max(counts.values()) == 1
    assert len(counts) == (split.steps * global_batch if drop_last else n)
