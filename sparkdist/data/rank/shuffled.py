"""A shuffled epoch's windows, read on the decode threads, a window of memory at a time.

A window's rows are permuted across the whole window (`sparkdist.data.rank.order`), so its
first piece needs every row: a window's row groups are decoded whole (a column group a
task, side by side on the decode threads), and each decoded column is put straight into
the window's pieces in the epoch's order (`row_block.RowLayout.fill`). The pieces are
handed out as they are; their memory is reused only once nothing refers to it
(`sparkdist.data.rank.piece_memory`). The next window is planned while this one is
decoded, and decoded once this one's pieces are all handed on to the thread that reads
ahead but the last ``2 * threads`` (`shuffled_chunks`): the decode threads decode it while
those are handed out, and the read holds one window of memory and the pieces read ahead.

With decode processes (`sparkdist.data.rank.decode_processes`) a window's tasks
(`DecodeTask`) run there, and put the rows into pieces of shared memory found by their
places (`Piece.where`); the next window is decoded as soon as this one is, beside its
whole hand-out, which this thread does. A read in order takes this path too (a row group a
window, its rows copied in order).
"""

from __future__ import annotations

import collections
import functools
import itertools
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparkdist.data import fs
from sparkdist.data.layout import ColumnInfo
from sparkdist.data.rank import (
    chunk_ring,
    column_streams,
    decode_processes,
    order,
    row_block,
    shared_slabs,
)
from sparkdist.data.rank.decode import Chunk, WindowDecoder, to_numpy_chunk, width
from sparkdist.data.rank.piece_memory import PieceMemory

Fill = Callable[[int, Chunk], None]  # puts a chunk's rows, decoded from a row on, in place


@dataclass(frozen=True)
class Placement:
    """Where a window's decoded rows go: ``rows[i]`` is the decoded row (counted across
    the window's row groups that are read) at position ``i`` of the epoch's order, and
    the positions ``cuts[k]:cuts[k + 1]`` are the ``k``-th piece."""

    rows: np.ndarray
    cuts: list[int]

    @functools.cached_property
    def _span(self) -> tuple[int, int]:
        return (int(self.rows.min()), int(self.rows.max())) if len(self.rows) else (0, -1)

    @functools.cached_property
    def _in_order(self) -> bool:
        """Whether the rows are consecutive, in order (a read in the files' order)."""
        low, high = self._span
        return high - low + 1 == len(self.rows) and bool((np.diff(self.rows) == 1).all())

    @functools.cached_property
    def _by_row(self) -> tuple[np.ndarray, np.ndarray]:
        """The positions sorted by decoded row, and those rows (found by bisection)."""
        positions = np.argsort(self.rows, kind="stable")
        return positions, self.rows[positions]

    def of(self, first: int, count: int) -> Iterator[tuple[int, row_block.Place]]:
        """Where decoded rows ``first:first + count`` go: (a piece, (its rows, their rows
        from ``first``)) for each piece that holds some; the piece whole (a slice) where
        it holds only those rows (the usual window: one row group, one chunk a column)."""
        low, high = self._span
        if first <= low and high < first + count:
            for index, (start, stop) in enumerate(itertools.pairwise(self.cuts)):
                if self._in_order:  # a read in the files' order: rows copied as they are
                    begin = low - first + start
                    yield index, (slice(None), slice(begin, begin + stop - start))
                    continue
                rows = self.rows[start:stop]  # a view where ``first`` is 0: the usual window
                yield index, (slice(None), rows - first if first else rows)
            return
        positions, rows = self._by_row
        start, stop = np.searchsorted(rows, [first, first + count])
        positions, rows = positions[start:stop], rows[start:stop] - first
        pieces = np.searchsorted(self.cuts, positions, side="right") - 1
        by_piece = np.argsort(pieces, kind="stable")
        bounds = np.searchsorted(pieces[by_piece], np.arange(len(self.cuts)))
        for index in range(len(self.cuts) - 1):
            taken = by_piece[bounds[index] : bounds[index + 1]]
            if len(taken):
                yield index, (positions[taken] - self.cuts[index], rows[taken])


@dataclass(frozen=True)
class Piece:
    """A piece of a window, in a slab of `PieceMemory`: a block a run
    (`row_block.RowLayout`), and its other columns an array each; ``handle``: the slab's,
    where it is shared with decode processes."""

    rows: int
    blocks: row_block.Blocks
    apart: Chunk
    handle: shared_slabs.Handle | None = None
    base: int = 0  # the slab's address here

    def where(self) -> tuple:
        """Where a decode process finds the piece: (handle, rows, the blocks' and the
        columns' (name, offset, shape, dtype))."""
        arrays = [(None, block) for block in self.blocks] + list(self.apart.items())
        places = tuple(
            (name, values.ctypes.data - self.base, values.shape, values.dtype.str)
            for name, values in arrays
        )
        return self.handle, self.rows, places

    @classmethod
    def found(cls, where: tuple) -> Piece:
        """In a decode process: the piece `where` says."""
        handle, rows, places = where
        arrays = [(name, shared_slabs.view(handle, *place)) for name, *place in places]
        blocks = tuple(values for name, values in arrays if name is None)
        apart = {name: values for name, values in arrays if name is not None}
        return cls(rows, blocks, apart)


@dataclass(frozen=True)
class DecodeTask:
    """A row group's columns to decode and put into a window's pieces: ``columns`` decoded
    whole, or (``stream_rows``) all of them streamed that many rows at a time; its rows
    start at ``first`` among the window's decoded rows."""

    url: str
    row_group: int
    columns: tuple[ColumnInfo, ...]
    first: int
    stream_rows: int | None = None

    def run(self, fill: Fill, footer: Any = None, threads: bool = True) -> Any:
        """Decode and fill (Arrow's own pool decodes if ``threads``); the file's footer."""
        parquet = fs.open_parquet(self.url, footer)
        names, first = [info.name for info in self.columns], self.first
        if self.stream_rows is None:
            table = parquet.read_row_group(self.row_group, columns=names, use_threads=threads)
            fill(first, to_numpy_chunk(table, self.columns))
            return parquet.metadata
        batches = parquet.iter_batches(
            self.stream_rows, row_groups=[self.row_group], columns=names, use_threads=threads
        )
        for batch in batches:
            fill(first, to_numpy_chunk(batch, self.columns))
            first += batch.num_rows
        return parquet.metadata


@dataclass(frozen=True)
class PlannedWindow:
    """A shuffled window, planned: ``tasks`` decode its row groups and put their rows into
    ``pieces`` (of ``sizes`` rows each) where ``placement`` says."""

    sizes: list[int]
    pieces: list[Piece]  # none until `decode`
    tasks: list[DecodeTask]
    placement: Placement
    # Kept while the window lives: its order in shared memory, for decode processes.
    shared: list = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(self.sizes)

    def decode(self, decoder: WindowDecoder, memory: PieceMemory, pool: Any) -> list:
        """Take the pieces' memory and start the tasks: on ``pool`` (threads, or
        `DecodeProcesses`), or at once in this thread. The memory is taken only now, not
        as the window is planned, so that a read holds one window planned ahead but the
        memory of the one being handed out."""
        self.pieces[:] = [_piece(decoder, memory, rows) for rows in self.sizes]
        if isinstance(pool, decode_processes.DecodeProcesses):
            window = _RemoteWindow.of(decoder.row_layout, self)
            return pool.run(_decode_remote, [(task, window) for task in self.tasks])
        fill = functools.partial(_fill, decoder.row_layout, self.pieces, self.placement)
        footers: dict[str, Any] = {}  # each file's, read once by the window's tasks
        # Column groups shared by several threads are decoded in each thread: Arrow's own
        # pool has OMP_NUM_THREADS threads (one under torchrun), and would decode them in turn.
        threads = decoder.threads == 1
        return [_submit(pool, _decode_here, task, fill, footers, threads) for task in self.tasks]


def _decode_here(task: DecodeTask, fill: Fill, footers: dict, threads: bool) -> None:
    footer = task.run(fill, footers.get(task.url), threads or task.stream_rows is not None)
    footers.setdefault(task.url, footer)


@dataclass(frozen=True)
class _RemoteWindow:
    """A window as a decode process finds it: its pieces' places, its order in shared
    memory (``rows``, ``cuts``: `Placement`), and the row layout."""

    layout: row_block.RowLayout
    pieces: tuple[tuple, ...]
    rows: tuple[shared_slabs.Handle, str, int]  # handle, dtype, count
    cuts: tuple[int, ...]

    @classmethod
    def of(cls, layout: row_block.RowLayout, window: PlannedWindow) -> _RemoteWindow:
        rows = window.placement.rows
        memory, handle = shared_slabs.shared(rows.nbytes, lasting=False)
        memory[:] = rows.view(np.uint8)
        window.shared.append(memory)  # its descriptor open while processes may map it
        pieces = tuple(piece.where() for piece in window.pieces)
        return cls(
            layout, pieces, (handle, rows.dtype.str, len(rows)), tuple(window.placement.cuts)
        )

    @functools.cached_property
    def found(self) -> list[Piece]:
        """The pieces, found once a message (its tasks share this window)."""
        return [Piece.found(where) for where in self.pieces]

    @functools.cached_property
    def placement(self) -> Placement:
        """The window's placement, made once a message (its ``_by_row``: a sort)."""
        handle, dtype, count = self.rows
        return Placement(shared_slabs.view(handle, 0, (count,), dtype), list(self.cuts))


_footers: dict[str, Any] = {}  # in a decode process: each file's footer, read once


def _decode_remote(task: DecodeTask, window: _RemoteWindow) -> None:
    """In a decode process: the task, decoded in this thread and put into the window's
    shared pieces."""
    fill = functools.partial(_fill, window.layout, window.found, window.placement)
    _footers[task.url] = task.run(fill, _footers.get(task.url), threads=False)


def plan_window(
    decoder: WindowDecoder,
    epoch_order: order.EpochOrder,
    window: order.Window,
    ranges: list,
    seen: int,
) -> PlannedWindow:
    """The work that decodes the window's row groups that hold the rows of ``ranges``
    (positions inside ``window``) and puts those rows into the window's pieces in the
    epoch's order: all row groups when the rank reads the whole window, else those it
    needs, one after the other.

    A window is decoded whole, and handed out in pieces of a quarter chunk (about 2 MiB):
    25-40 MiB less memory in flight than whole chunks (docs/data.md). The pieces end
    where the epoch's rows (``seen`` before the window) reach a multiple of a piece, whole
    batches of the reader's (so few batches span two pieces: a copy each).
    """
    piece = max(decoder.chunk_rows // 4, 1)
    permutation = epoch_order.permutation(window)
    if ranges == [(0, window.rows)]:
        rows = permutation
    else:
        rows = np.concatenate([permutation[lo:hi] for lo, hi in ranges])
    bounds = np.cumsum([0] + [block.rows for block in window.blocks])
    hit = np.arange(len(window.blocks))
    if len(rows) < window.rows and len(window.blocks) > 1:
        hit = np.unique(np.searchsorted(bounds, rows, side="right") - 1)
    # The hit row groups are decoded one after the other: where each one's rows start.
    firsts = np.cumsum([0] + [window.blocks[index].rows for index in hit])[:-1]
    offsets = np.zeros(len(window.blocks), dtype=np.int64)
    offsets[hit] = firsts - bounds[hit]
    rows = np.asarray(rows, dtype=np.intp)  # ``np.take``'s indices, not cast at each call
    if offsets.any():  # only some row groups are decoded: rows counted among those
        rows = rows + offsets[np.searchsorted(bounds, rows, side="right") - 1]
    cuts = [0, *range((-seen) % piece or piece, len(rows), piece), len(rows)]
    tasks: list[DecodeTask] = []
    for index, first in zip(hit, firsts.tolist(), strict=True):
        block = window.blocks[index]
        url = decoder.layout.file_urls[block.file_index]
        groups = column_groups(decoder, block)
        if groups is None:  # rows streamed, put in place as they come
            tasks.append(DecodeTask(url, block.row_group, decoder.columns, first, piece))
        else:  # a task a column group, all of the window's at once: a thread done takes another
            tasks += [DecodeTask(url, block.row_group, tuple(g), first) for g in groups]
    sizes = [stop - start for start, stop in itertools.pairwise(cuts)]
    return PlannedWindow(sizes, [], tasks, Placement(rows, cuts))


def _piece(decoder: WindowDecoder, memory: PieceMemory, rows: int) -> Piece:
    """A piece of ``rows`` rows in ``memory``: a block a run, an array a column apart."""
    layout = decoder.row_layout
    known = {info.name: info for info in decoder.columns}
    shapes = [(run.shape(rows), run.dtype) for run in layout.runs]
    apart = [(name, _shape(known[name], rows), _dtype(known[name])) for name in layout.apart]
    sizes = [int(np.prod(shape)) * dtype.itemsize for shape, dtype in shapes]
    sizes += [
        int(np.prod(shape)) * dtype.itemsize for _, shape, dtype in apart if dtype.kind != "O"
    ]
    carver = memory.carver(chunk_ring.room_for(sizes))
    blocks = tuple(carver.carve(shape, dtype) for shape, dtype in shapes)
    columns = {
        name: np.empty(shape, object) if dtype.kind == "O" else carver.carve(shape, dtype)
        for name, shape, dtype in apart
    }
    return Piece(rows, blocks, columns, carver.handle, carver.host.ctypes.data)


def _shape(info: ColumnInfo, rows: int) -> tuple[int, ...]:
    return (rows, info.length or 0) if info.kind == "array" else (rows,)


def _dtype(info: ColumnInfo) -> np.dtype:
    return np.dtype(object if info.kind in ("string", "binary") else info.dtype)


def _fill(
    layout: row_block.RowLayout,
    pieces: list[Piece],
    placement: Placement,
    first: int,
    chunk: Chunk,
) -> None:
    """Put ``chunk``'s columns (decoded rows from ``first`` on) where the epoch's order
    puts them in the window's pieces."""
    targets = [(pieces[index], place) for index, place in placement.of(first, _rows(chunk))]
    layout.fill([(piece.blocks, place) for piece, place in targets], chunk)
    for piece, place in targets:
        for name, values in piece.apart.items():
            if name in chunk:
                row_block.placed(chunk[name], place, values)


def _rows(chunk: Chunk) -> int:
    return len(next(iter(chunk.values()))) if chunk else 0


def column_groups(decoder: WindowDecoder, block: order.Block) -> list[list[ColumnInfo]] | None:
    """How a row group is decoded: groups of whole columns, about a piece each, or None
    (rows streamed a piece at a time, all columns).

    Where a column of the row group fits in a chunk (the narrow columns of a wide
    table), some columns are decoded whole at a time: Arrow decodes a call's columns
    on every core, 2x faster than rows streamed a piece at a time, and the columns are
    laid into the window's rows several at once. An array column as wide as the window
    is streamed instead, so that no more than a piece of it is decoded at once.

    The groups are of about equal bytes, at least one a decode thread: a window of one
    row group (Spark's files) cut into a chunk's worth and a remainder kept one thread
    waiting on the other (py-spy: the decode threads idle a third of the time). Groups of
    a piece (a quarter chunk) rather than a chunk leave less of a window's decoding to
    one thread at its end (both threads busy 3 % of the time, not 9 %, 64 columns), and
    hold less decoded Arrow memory at once; the calls cost no more CPU.
    """
    widths = {info.name: width(info) for info in decoder.columns}
    budget = decoder.chunk_rows * sum(widths.values())
    if block.rows * max(widths.values()) > budget:
        return None
    known = {info.name: info for info in decoder.columns}
    sizes = {name: block.rows * widths[name] for name in decoder.row_layout.decode_order}
    total = sum(sizes.values())
    count = max(-(-total * 4 // budget), decoder.threads, 1)
    return [[known[name] for name in group] for group in column_streams.column_groups(sizes, count)]


def handed(decoder: WindowDecoder, piece: Piece) -> Chunk:
    """A piece as the chunk handed out: transformed and stacked as the decoder says, in
    the decoder's ``memory`` (a device feed's slot) where no transform follows."""
    alloc = None
    if decoder.memory is not None and decoder.transform is None:
        numbers = [*piece.blocks, *(v for v in piece.apart.values() if v.dtype != object)]
        nbytes = chunk_ring.room_for(values.nbytes for values in numbers)
        alloc = decoder.memory(nbytes, piece.rows).carve
    return decoder.transformed(decoder.row_layout.split(piece.blocks, piece.apart, alloc))


def shuffled_chunks(
    decoder: WindowDecoder,
    plan: order.EpochPlan,
    memory: PieceMemory,
    pool: ThreadPoolExecutor | decode_processes.DecodeProcesses | None,
) -> Iterator[Chunk]:
    """One shuffled epoch's chunks, window after window, handed ``2 * threads`` pieces
    ahead on ``pool``. The next window is planned while this one is decoded; once this
    one's pieces are all with the pool but those, the next takes its memory and its
    decoding is queued behind them, so the decode threads decode it while this window's
    last pieces are handed out. Without a pool, the same steps run one after the other in
    this thread.

    With decode processes, this thread hands the pieces out, and the next window is
    decoded as soon as this one is, beside all of its hand-out (two windows of memory):
    the processes do not take this process's GIL, so decoding beside slows no hand-out.
    """
    beside = isinstance(pool, decode_processes.DecodeProcesses)
    hands = None if beside else pool
    ahead = 2 * decoder.threads if hands is not None else 1
    windows = list(plan.pieces)
    pending: collections.deque[Future] = collections.deque()  # pieces being handed
    decoding: list = []  # the window's decoding: futures, or `decode_processes.Done`
    try:
        if windows:
            window = plan_window(decoder, plan.order, *windows[0], 0)
            decoding = window.decode(decoder, memory, pool)
        seen = 0
        for index in range(len(windows)):
            following = None
            if index + 1 < len(windows):  # planned while this window is decoded
                rows = seen + window.rows
                following = plan_window(decoder, plan.order, *windows[index + 1], rows)
            for future in decoding:  # a decoding error is raised before any piece
                future.result()
            decoding = []
            if beside and following is not None:
                decoding = following.decode(decoder, memory, pool)
            pieces = iter(window.pieces)
            first = itertools.islice(pieces, ahead)
            pending.extend(_submit(hands, handed, decoder, piece) for piece in first)
            for piece in pieces:
                yield pending.popleft().result()
                pending.append(_submit(hands, handed, decoder, piece))
            seen += window.rows
            if following is not None:  # its memory, once this window's is handed on
                if not beside:
                    decoding = following.decode(decoder, memory, pool)
                window = following
            while pending:
                yield pending.popleft().result()
    finally:
        for future in [*pending, *decoding]:  # what has not started never does
            future.cancel()


def _submit(pool: ThreadPoolExecutor | None, function: Callable, *args: object) -> Future:
    """``function(*args)`` on ``pool``, or (None) at once in this thread."""
    if pool is not None:
        return pool.submit(function, *args)
    future: Future = Future()
    try:
        future.set_result(function(*args))
    except Exception as error:  # raised where the result is asked for, as a pool's is
        future.set_exception(error)
    return future
