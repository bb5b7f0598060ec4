"""Which rows a rank reads in an epoch: one global order, split equally, resumable.

The epoch's **global order** is a permutation of all N rows that depends only on the
data's row groups, the seed and the epoch, never on the number of ranks (as in Mosaic
Streaming): with ``shuffle`` the row groups ("blocks") are permuted with a seeded RNG,
consecutive blocks are gathered into windows of at least ``window_rows`` rows, and the
rows of each window are permuted. Without ``shuffle`` it is the files' own order.
`randomness` measures how far an order is from a true permutation (docs/data.md gives
the figures).

A world of W ranks splits what is left of the epoch's order, ``remaining`` (intervals of
positions in the global order; all of ``[0, N)`` when an epoch starts), into W equal
contiguous slices, one per rank, so that a rank reads few row groups and no data moves
between ranks. Equal steps: every slice has ``ceil(R/W)`` rows, the last ones padded by
repeating the first rows of the remaining order (as torch's DistributedSampler pads), or
``floor(R/W)`` rows with ``drop_last`` (the tail is not read this epoch).

With a global batch of G rows (`GlobalSplit`) the default split stays contiguous: rank
``r`` reads one contiguous part of what is left, so which rows a step reads depends on the
world's size. ``rank_split="per_step"`` makes step ``s`` read exactly positions ``[s*G,
(s+1)*G)`` of what is left, whatever the world's size, rank ``r`` the ``r``-th part of each
step (`per_step_rank_slice`); every rank then touches every window of the order.

Position: ranks step in lockstep (one batch each per step, as DDP/Horovod/TF allreduce
force), so after ``s`` steps of batch ``b`` every rank has read the first ``min(s*b,
slice)`` rows of its slice, and the world has consumed ``W * s * b`` rows (less at the end
of the epoch). `Position` computes what is left from that alone, so any rank's
``state_dict()`` is the world's; a new world of any size splits what is left again.

Plan: what one reader (or one of a DataLoader's decode workers: every k-th batch) reads of
each epoch of an iteration, window by window, with the rows that are pads and the rows'
weights (`EpochPlans`, an `EpochPlan` per epoch).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

Interval = tuple[int, int]  # positions [start, stop) in the epoch's global order

DEFAULT_WINDOW_ROWS = 8192


@dataclass(frozen=True)
class Block:
    """One row group: where it is and where its rows start in file order."""

    file_index: int
    row_group: int
    rows: int
    first_row: int  # index of its first row when all files are read in order


def blocks_of(row_group_rows: Sequence[Sequence[int]]) -> list[Block]:
    blocks, first = [], 0
    for file_index, rows in enumerate(row_group_rows):
        for row_group, n in enumerate(rows):
            if n:
                blocks.append(Block(file_index, row_group, n, first))
            first += n
    return blocks


@dataclass(frozen=True)
class Window:
    """Consecutive blocks of the global order whose rows are shuffled together."""

    index: int
    blocks: tuple[Block, ...]
    start: int  # position of its first row in the global order
    rows: int


@dataclass
class EpochOrder:
    """The global order of one epoch (same for every world size)."""

    row_group_rows: Sequence[Sequence[int]]
    seed: int
    epoch: int
    shuffle: bool = True
    window_rows: int = DEFAULT_WINDOW_ROWS
    windows: list[Window] = field(init=False)

    def __post_init__(self) -> None:
        blocks = blocks_of(self.row_group_rows)
        if self.shuffle:
            rng = np.random.default_rng([self.seed, self.epoch])
            blocks = [blocks[i] for i in rng.permutation(len(blocks))]
        self.windows, current, start, rows = [], [], 0, 0
        for block in blocks:
            current.append(block)
            rows += block.rows
            if not self.shuffle or rows >= self.window_rows:
                self.windows.append(Window(len(self.windows), tuple(current), start, rows))
                current, start, rows = [], start + rows, 0
        if current:
            self.windows.append(Window(len(self.windows), tuple(current), start, rows))
        self._starts = [w.start for w in self.windows]

    @property
    def num_rows(self) -> int:
        return sum(w.rows for w in self.windows)

    def permutation(self, window: Window) -> np.ndarray:
        """Row order inside ``window``: indices into its blocks' rows, concatenated."""
        return _permutation(self.seed, self.epoch, window.index, window.rows, self.shuffle)

    def pieces(self, intervals: Sequence[Interval]) -> list[tuple[Window, int, int]]:
        """``(window, lo, hi)``: the intervals cut at window edges (lo/hi inside the window)."""
        out = []
        for start, stop in intervals:
            i = bisect.bisect_right(self._starts, start) - 1
            while start < stop:
                window = self.windows[i]
                hi = min(stop, window.start + window.rows)
                out.append((window, start - window.start, hi - window.start))
                start, i = hi, i + 1
        return out

    def row_ids(self, intervals: Sequence[Interval]) -> np.ndarray:
        """The file-order row indices at these positions (for tests and checks)."""
        parts = []
        for window, lo, hi in self.pieces(intervals):
            firsts = np.concatenate([np.arange(b.rows) + b.first_row for b in window.blocks])
            parts.append(firsts[self.permutation(window)[lo:hi]])
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def _permutation(seed: int, epoch: int, window: int, rows: int, shuffle: bool) -> np.ndarray:
    """A reader draws each window's order once (8 ms for 524k rows), so none is kept; int32
    (2 MiB for 524k rows) where it fits: the same order as ``permutation(rows)``."""
    dtype = np.int32 if rows < 2**31 else np.int64
    if not shuffle:
        return np.arange(rows, dtype=dtype)
    return np.random.default_rng([seed, epoch, window, 1]).permutation(np.arange(rows, dtype=dtype))


def randomness(row_ids: np.ndarray, batch_size: int) -> dict[str, float]:
    """How far an epoch's order (file-order row ids by position) is from a true permutation.

    ``spearman``: the correlation between a row's position in the files and in the epoch
    (a true permutation: about 0, within ``1/sqrt(N)``; the files' order: 1).
    ``neighbours``: the share of rows whose next row in the files is in the same batch (a
    true permutation: ``(batch_size - 1) / (N - 1)``; the files' order: about 1).
    """
    row_ids = np.asarray(row_ids)
    n = len(row_ids)
    if n < 2:
        return {"spearman": 0.0, "neighbours": 0.0}
    position = np.empty(n, dtype=np.int64)
    position[row_ids] = np.arange(n)
    batch = position // batch_size
    return {
        "spearman": float(np.corrcoef(np.arange(n), row_ids)[0, 1]),
        "neighbours": float(np.mean(batch[:-1] == batch[1:])),
    }


def total(intervals: Sequence[Interval]) -> int:
    return sum(stop - start for start, stop in intervals)


def take(intervals: Sequence[Interval], lo: int, hi: int) -> list[Interval]:
    """Positions ``[lo, hi)`` of the sequence the intervals make, as intervals."""
    return take_many(intervals, [(lo, hi)])


def take_many(intervals: Sequence[Interval], ranges: Sequence[Interval]) -> list[Interval]:
    """Positions of each of ``ranges`` (increasing, apart) of the sequence the intervals
    make, as intervals (a range across intervals gives a piece of each). Vectorised: a
    per-step slice has an interval a step, 200k for 10M rows at ``G=48``."""
    cut = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
    if not len(intervals) or not len(cut):
        return []
    bounds = np.asarray(intervals, dtype=np.int64).reshape(-1, 2)
    edges = np.concatenate([[0], np.cumsum(bounds[:, 1] - bounds[:, 0])])  # in the sequence
    lo, hi = cut[:, 0], np.minimum(cut[:, 1], edges[-1])
    lo, hi = lo[lo < hi], hi[lo < hi]
    if not len(lo):
        return []
    points = np.unique(np.concatenate([lo, hi, edges]))  # pieces in one range and one interval
    begin, end = points[:-1], points[1:]
    owner = np.searchsorted(lo, begin, side="right") - 1
    inside = (owner >= 0) & (begin < hi[np.maximum(owner, 0)])
    begin, end = begin[inside], end[inside]
    which = np.searchsorted(edges, begin, side="right") - 1  # the interval a piece is in
    first = bounds[which, 0] + begin - edges[which]
    return list(zip(first.tolist(), (first + end - begin).tolist(), strict=True))


def _merge(intervals: Sequence[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for start, stop in intervals:
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], stop)
        elif start < stop:
            out.append((start, stop))
    return out


def slice_rows(remaining_rows: int, world: int, drop_last: bool) -> int:
    """Rows each rank reads from what is left of the epoch (equal on every rank)."""
    return remaining_rows // world if drop_last else -(-remaining_rows // world)


def rank_slice(
    remaining: Sequence[Interval], rank: int, world: int, drop_last: bool
) -> list[Interval]:
    """Rank ``rank``'s slice of the remaining order, padding included (equal lengths)."""
    size = total(remaining)
    each = slice_rows(size, world, drop_last)
    lo, hi = rank * each, (rank + 1) * each
    own = take(remaining, lo, min(hi, size))
    padding = hi - max(lo, size)
    while padding > 0:  # repeat the first rows of the remaining order
        own += take(remaining, 0, min(padding, size))
        padding -= size
    return own


def own_rows(remaining: Sequence[Interval], rank: int, world: int, drop_last: bool) -> int:
    """How many rows of rank ``rank``'s slice are its own; the rest of the slice are pads."""
    size = total(remaining)
    each = slice_rows(size, world, drop_last)
    return max(0, min(each, size - rank * each))


def left_after(
    remaining: Sequence[Interval], world: int, drop_last: bool, rows_per_rank: int
) -> list[Interval]:
    """What is left once every rank read the first ``rows_per_rank`` rows of its slice."""
    size = total(remaining)
    each = slice_rows(size, world, drop_last)
    done = min(rows_per_rank, each)
    left: list[Interval] = []
    for rank in range(world):
        lo, hi = rank * each + done, min((rank + 1) * each, size)
        if lo < hi:
            left += take(remaining, lo, hi)
    return _merge(left)


def shares(rows: int, world: int) -> list[int]:
    """``rows`` split over ``world`` ranks as evenly as can be: shares differ by one at most."""
    base, extra = divmod(rows, world)
    return [base + (rank < extra) for rank in range(world)]


@dataclass(frozen=True)
class GlobalSplit:
    """How a world reads what is left of an epoch in steps of ``global_batch`` rows.

    Each step the world reads ``global_batch`` rows, rank ``r`` its ``share[r]``; the last
    step reads the rest, ``last[r]`` each (shared as evenly), and a rank whose ``last`` is
    0 reads one pad so that every rank steps. Rank ``r``'s rows are one contiguous part of
    the remaining order, after those of the ranks before it (as `rank_slice`'s are).
    """

    steps: int
    share: tuple[int, ...]
    last: tuple[int, ...]

    def real(self, rank: int) -> int:
        """Rows of the epoch rank ``rank`` reads that are not pads."""
        return (self.steps - 1) * self.share[rank] + self.last[rank] if self.steps else 0

    def start(self, rank: int) -> int:
        return sum(self.real(other) for other in range(rank))

    def rows_in_last_step(self) -> int:
        return sum(self.last)


def global_split(
    remaining_rows: int, world: int, global_batch: int, drop_last: bool
) -> GlobalSplit:
    steps = remaining_rows // global_batch if drop_last else -(-remaining_rows // global_batch)
    last_rows = min(remaining_rows - (steps - 1) * global_batch, global_batch) if steps else 0
    share = tuple(shares(global_batch, world))
    return GlobalSplit(steps, share, tuple(shares(last_rows, world)))


def global_rank_slice(
    remaining: Sequence[Interval], rank: int, world: int, global_batch: int, drop_last: bool
) -> list[Interval]:
    """Rank ``rank``'s rows of the remaining order in steps of ``global_batch`` (`GlobalSplit`)."""
    split = global_split(total(remaining), world, global_batch, drop_last)
    lo = split.start(rank)
    own = take(remaining, lo, lo + split.real(rank))
    if split.steps and not split.last[rank]:
        own += take(remaining, 0, 1)  # a pad, so that this rank takes the last step too
    return own


def global_left_after(
    remaining: Sequence[Interval], world: int, global_batch: int, drop_last: bool, steps: int
) -> list[Interval]:
    """What is left once the world took ``steps`` steps of ``global_batch`` rows."""
    split = global_split(total(remaining), world, global_batch, drop_last)
    left: list[Interval] = []
    for rank in range(world):
        start, real = split.start(rank), split.real(rank)
        done = min(steps * split.share[rank], real)
        left += take(remaining, start + done, start + real)
    return _merge(left)


def per_step_rank_slice(
    remaining: Sequence[Interval], rank: int, world: int, global_batch: int, drop_last: bool
) -> list[Interval]:
    """Rank ``rank``'s rows when step ``s`` reads positions ``[s*G, (s+1)*G)`` of the
    remaining order whatever the world's size: the ``rank``-th part of each step, shared as
    `GlobalSplit` shares it (a pad, the first row, where the last step leaves it none)."""
    split = global_split(total(remaining), world, global_batch, drop_last)
    if not split.steps:
        return []
    firsts = np.arange(split.steps - 1, dtype=np.int64) * global_batch + sum(split.share[:rank])
    wanted = np.stack([firsts, firsts + split.share[rank]], axis=1)
    last = (split.steps - 1) * global_batch + sum(split.last[:rank])
    wanted = np.concatenate([wanted, [(last, last + split.last[rank])]])
    own = _merge(take_many(remaining, wanted))
    if not split.last[rank]:
        own += take(remaining, 0, 1)  # a pad, so that this rank takes the last step too
    return own


def per_step_left_after(
    remaining: Sequence[Interval], global_batch: int, drop_last: bool, steps: int
) -> list[Interval]:
    """What is left once the world took ``steps`` steps of ``global_batch`` rows, each the
    next rows of the remaining order: the same for every world size."""
    size = total(remaining)
    if steps >= global_split(size, 1, global_batch, drop_last).steps:
        return []  # the epoch is read (with ``drop_last``, its tail is not this epoch)
    return take(remaining, steps * global_batch, size)


RANK_SPLITS = ("contiguous", "per_step")


def check_rank_split(rank_split: str, global_batch_size: int | None) -> None:
    """Refuse an unknown split, and a per-step split without a global batch to step by."""
    if rank_split not in RANK_SPLITS:
        raise ValueError(f"rank_split must be one of {RANK_SPLITS}, not {rank_split!r}")
    if rank_split == "per_step" and global_batch_size is None:
        raise ValueError(
            'rank_split="per_step" splits each step of global_batch_size rows among the ranks: '
            "give global_batch_size too"
        )


@dataclass
class Position:
    """Where the world is: epoch, and what is left of the epoch's global order.

    ``state_dict()`` is small and picklable; store it with the model in
    ``sparkdist.checkpoint.save`` and give it to ``load_state_dict`` after a relaunch or
    a resize. It counts the batches this rank has handed out since the epoch (or the
    resume) started, and assumes every rank handed out as many (lockstep). With
    ``global_batch_size`` a step is that many rows for the whole world, whatever its size
    (`GlobalSplit`), and ``batch_size`` is not used; ``rank_split="per_step"`` makes a
    step's rows those of the same step of any other world (`per_step_rank_slice`).
    """

    num_rows: int
    seed: int
    rank: int
    world: int
    batch_size: int
    drop_last: bool = False
    epoch: int = 0
    remaining: list[Interval] = field(default_factory=list)
    batches: int = 0  # handed out in this epoch since `remaining` was set
    global_batch_size: int | None = None
    rank_split: str = "contiguous"

    def __post_init__(self) -> None:
        if not self.remaining:
            self.remaining = [(0, self.num_rows)] if self.num_rows else []
        check_global_batch(self.global_batch_size, self.world)
        check_rank_split(self.rank_split, self.global_batch_size)

    def split(self) -> GlobalSplit:
        """The world's steps over what is left (only with ``global_batch_size``)."""
        assert self.global_batch_size is not None
        return global_split(
            total(self.remaining), self.world, self.global_batch_size, self.drop_last
        )

    def rank_batch_size(self) -> int:
        """Rows of this rank's batches (its share of a global batch, if one is set)."""
        if self.global_batch_size is None:
            return self.batch_size
        return shares(self.global_batch_size, self.world)[self.rank]

    def copy(self) -> Position:
        return dataclasses.replace(self, remaining=list(self.remaining))

    def slice(self) -> list[Interval]:
        if self.rank_split == "per_step":
            return per_step_rank_slice(
                self.remaining, self.rank, self.world, self.global_batch_size, self.drop_last
            )
        if self.global_batch_size is not None:
            return global_rank_slice(
                self.remaining, self.rank, self.world, self.global_batch_size, self.drop_last
            )
        return rank_slice(self.remaining, self.rank, self.world, self.drop_last)

    def own_rows(self) -> int:
        """Rows of this rank's slice that are not pads (see `rank_slice`)."""
        if self.global_batch_size is not None:
            return self.split().real(self.rank)
        return own_rows(self.remaining, self.rank, self.world, self.drop_last)

    def batches_in_epoch(self) -> int:
        if self.global_batch_size is not None:
            return self.split().steps
        each = slice_rows(total(self.remaining), self.world, self.drop_last)
        return -(-each // self.batch_size)

    def batches_in_epochs(self, epochs: int) -> int:
        """Batches each rank gets in ``epochs`` epochs from here (the first: what is left)."""
        position = self.copy()
        position.settle()
        count = 0
        for _ in range(epochs):
            count += position.batches_in_epoch()
            position.next_epoch()
        return count

    def for_world(self, rank: int, world: int) -> Position:
        """This position, read by rank ``rank`` of ``world``: what the old world read stays
        read (the batches handed out are folded in first), the rest is split anew."""
        check_global_batch(self.global_batch_size, world)
        position = self.copy()
        position.settle()
        position.rank, position.world = rank, world
        return position

    def next_epoch(self) -> None:
        self.epoch += 1
        self.remaining = [(0, self.num_rows)] if self.num_rows else []
        self.batches = 0

    def _left(self) -> list[Interval]:
        if self.rank_split == "per_step":
            return per_step_left_after(
                self.remaining, self.global_batch_size, self.drop_last, self.batches
            )
        if self.global_batch_size is not None:
            return global_left_after(
                self.remaining, self.world, self.global_batch_size, self.drop_last, self.batches
            )
        rows_per_rank = self.batches * self.batch_size
        return left_after(self.remaining, self.world, self.drop_last, rows_per_rank)

    def started(self) -> Position:
        """`settle`, for a new iteration: a copy of where it starts."""
        self.settle()
        return self.copy()

    def settle(self) -> None:
        """Fold the batches handed out into ``remaining`` (before a new iteration)."""
        if self.batches:
            self.remaining, self.batches = self._left(), 0
            if not self.remaining:
                self.next_epoch()

    def state_dict(self) -> dict:
        left = self._left()
        if not left:
            epoch, left = self.epoch + 1, [(0, self.num_rows)]
        else:
            epoch = self.epoch
        return {
            "epoch": epoch,
            "rows_consumed": self.num_rows - total(left),
            "seed": self.seed,
            "num_rows": self.num_rows,
            "remaining": [list(interval) for interval in left],
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("num_rows") != self.num_rows:
            raise ValueError(
                f"the loader state is for {state.get('num_rows')} rows, but this data has "
                f"{self.num_rows}: a loader position only resumes the same converted data"
            )
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.remaining = _merge([(int(a), int(b)) for a, b in state["remaining"]])
        self.batches = 0


def check_global_batch(global_batch_size: int | None, world: int) -> None:
    """Refuse a global batch that some rank of ``world`` would get no row of."""
    if global_batch_size is None:
        return
    if global_batch_size < 1:
        raise ValueError(f"global_batch_size must be at least 1, got {global_batch_size}")
    if global_batch_size < world:
        raise ValueError(
            f"global_batch_size={global_batch_size} is smaller than the world ({world} ranks): "
            f"every rank needs at least one row a step; use a global batch of at least {world}"
        )


# -- an iteration's plan: what one reader (or decode worker) reads of each epoch --


def wanted_intervals(
    rank_slice: Sequence[Interval],
    batch_size: int,
    worker: int,
    workers: int,
    batches_before: int = 0,
) -> list[Interval]:
    """The part of a rank's slice that decode worker ``worker`` of ``workers`` reads.

    Worker ``w`` makes the rank's batches ``w, w + workers, ...`` of the iteration (the
    epoch's batch ``k`` is the iteration's ``batches_before + k``), the order in which
    ``torch.utils.data.DataLoader`` takes them from its workers, so together they yield
    the rank's batches in order, each row once.
    """
    if workers == 1:
        return list(rank_slice)
    rows = total(rank_slice)
    first = (worker - batches_before) % workers
    starts = np.arange(first * batch_size, rows, workers * batch_size, dtype=np.int64)
    return take_many(rank_slice, np.stack([starts, np.minimum(starts + batch_size, rows)], 1))


def worker_rows(first_rows: int, batch_size: int, worker: int, workers: int, before: int) -> int:
    """How many of a slice's first ``first_rows`` rows decode worker ``worker`` of
    ``workers`` reads (`wanted_intervals`, counted without making them)."""
    if workers == 1:
        return first_rows
    cycles, rest = divmod(first_rows, workers * batch_size)  # a cycle: a batch of each worker
    mine = (worker - before) % workers * batch_size  # where its batch starts in a cycle
    return cycles * batch_size + min(max(rest - mine, 0), batch_size)


@dataclass(frozen=True)
class EpochPlan:
    """What one reader (or decode worker) reads of an epoch, and how to mark its rows."""

    order: EpochOrder
    pieces: list  # (window, [(lo, hi) positions inside it]) in reading order
    real: int  # its rows before the pads
    full: int  # its rows before the epoch's last (short) step, with a global batch
    weights: tuple[float, float]  # a row's weight in a full step and in the last one


class EpochPlans:
    """What decode worker ``worker`` of ``workers`` reads of each epoch from ``start`` on,
    epoch after epoch for ever (the reader takes as many as it reads), of the data's row
    groups in each epoch's order (``shuffle``d in windows of ``window_rows``)."""

    def __init__(
        self,
        start: Position,
        row_group_rows: Sequence[Sequence[int]],
        shuffle: bool,
        window_rows: int,
        worker: int = 0,
        workers: int = 1,
    ) -> None:
        self.row_group_rows, self.shuffle, self.window_rows = row_group_rows, shuffle, window_rows
        self.worker, self.workers = worker, workers
        self._position = start.copy()
        self._before: int | None = None  # the iteration's batches before the next epoch

    def __iter__(self) -> EpochPlans:
        return self

    def __next__(self) -> EpochPlan:
        position = self._position
        if self._before is None:
            self._before = 0
        else:  # the previous epoch was planned: on to the next
            self._before += position.batches_in_epoch()
            position.next_epoch()
        epoch_order = EpochOrder(
            self.row_group_rows, position.seed, position.epoch, self.shuffle, self.window_rows
        )
        return epoch_plan(position, epoch_order, self.worker, self.workers, self._before)


def epoch_plan(
    position: Position, epoch_order: EpochOrder, worker: int, workers: int, before: int
) -> EpochPlan:
    """What decode worker ``worker`` of ``workers`` reads of the epoch at ``position``
    (``before``: the iteration's batches before this epoch)."""
    size = position.rank_batch_size()

    wanted = wanted_intervals(position.slice(), size, worker, workers, before)
    # Pads end the slice: this worker's rows before that end are its own.
    real = worker_rows(position.own_rows(), size, worker, workers, before)
    full = worker_rows(
        max(position.batches_in_epoch() - 1, 0) * size, size, worker, workers, before
    )
    weights = global_weights(position) if position.global_batch_size else (1.0, 1.0)
    return EpochPlan(epoch_order, _by_window(epoch_order.pieces(wanted)), real, full, weights)


def global_weights(position: Position) -> tuple[float, float]:
    """A row's weight in a full step and in the epoch's last step, with a global batch.

    A rank's loss is the sum of its rows' losses times their weight, ``world / rows of
    the step``; DDP's average over the ranks is then the mean over the step's rows. Pads
    weigh 0.
    """
    split, world = position.split(), position.world
    return world / position.global_batch_size, world / max(split.rows_in_last_step(), 1)


def _by_window(pieces: list[tuple[Window, int, int]]) -> list[tuple[Window, list]]:
    """Consecutive pieces of one window together, so that each window is read once."""
    grouped: list[tuple[Window, list]] = []
    for window, lo, hi in pieces:
        if grouped and grouped[-1][0].index == window.index:
            grouped[-1][1].append((lo, hi))
        else:
            grouped.append((window, [(lo, hi)]))
    return grouped
