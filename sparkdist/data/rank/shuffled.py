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
"""

from __future__ import annotations

import collections
import functools
import itertools
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkdist.data import fs
from sparkdist.data.layout import ColumnInfo
from sparkdist.data.rank import chunk_ring, column_streams, order, row_block
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
    (`row_block.RowLayout`), and its other columns an array each."""

    rows: int
    blocks: row_block.Blocks
    apart: Chunk


@dataclass(frozen=True)
class PlannedWindow:
    """A shuffled window, planned: ``tasks`` decode its row groups and put their rows into
    ``pieces`` (of ``sizes`` rows each) in the epoch's order."""

    sizes: list[int]
    pieces: list[Piece]  # none until `decode`
    tasks: list[Callable[[], None]]

    @property
    def rows(self) -> int:
        return sum(self.sizes)

    def decode(self, decoder: WindowDecoder, memory: PieceMemory, pool: Any) -> list[Future]:
        """Take the pieces' memory and start the tasks (on ``pool``, or at once in this
        thread): the memory is taken only now, not as the window is planned, so that a
        read holds one window planned ahead but the memory of the one being handed out."""
        self.pieces[:] = [_piece(decoder, memory, rows) for rows in self.sizes]
        return [_submit(pool, task) for task in self.tasks]


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
    pieces: list[Piece] = []  # `PlannedWindow.decode` takes their memory
    fill = functools.partial(_fill, decoder.row_layout, pieces, Placement(rows, cuts))
    footers: dict[str, object] = {}  # each file's, read once by the window's tasks
    tasks: list[Callable[[], None]] = []
    for index, first in zip(hit, firsts.tolist(), strict=True):
        block = window.blocks[index]
        groups = column_groups(decoder, block)
        if groups is None:  # rows streamed, put in place as they come
            tasks.append(functools.partial(_stream_into, decoder, block, piece, fill, first))
        else:  # a task a column group, all of the window's at once: a thread done takes another
            task = functools.partial(_columns_into, decoder, block, fill, first, footers)
            tasks += [functools.partial(task, group) for group in groups]
    sizes = [stop - start for start, stop in itertools.pairwise(cuts)]
    return PlannedWindow(sizes, pieces, tasks)


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
    return Piece(rows, blocks, columns)


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


def _columns_into(
    decoder: WindowDecoder,
    block: order.Block,
    fill: Fill,
    first: int,
    footers: dict,
    columns: list[ColumnInfo],
) -> None:
    """Some columns of a row group (its rows from ``first`` on in the window), decoded
    whole and filled in by the decoding thread. Each call opens the file (a file is read
    by one thread), with the footer another of the window's tasks read (``footers``)."""
    url = decoder.layout.file_urls[block.file_index]
    parquet = fs.open_parquet(url, footers.get(url))
    footers.setdefault(url, parquet.metadata)
    # Decoded in this thread where the window's groups are shared by several: Arrow's own
    # pool has OMP_NUM_THREADS threads (one under torchrun) and would decode them in turn.
    names, alone = [info.name for info in columns], decoder.threads == 1
    table = parquet.read_row_group(block.row_group, columns=names, use_threads=alone)
    fill(first, to_numpy_chunk(table, columns))


def _stream_into(
    decoder: WindowDecoder, block: order.Block, piece: int, fill: Fill, first: int
) -> None:
    """A row group's rows, all columns, streamed ``piece`` rows at a time and filled in."""
    for batch in decoder.batches(block, piece):
        fill(first, to_numpy_chunk(batch, decoder.columns))
        first += batch.num_rows


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
    pool: ThreadPoolExecutor | None,
) -> Iterator[Chunk]:
    """One shuffled epoch's chunks, window after window, handed ``2 * threads`` pieces
    ahead on ``pool``. The next window is planned while this one is decoded; once this
    one's pieces are all with the pool but those, the next takes its memory and its
    decoding is queued behind them, so the decode threads decode it while this window's
    last pieces are handed out. Without a pool, the same steps run one after the other in
    this thread."""
    ahead = 2 * decoder.threads if pool is not None else 1
    windows = list(plan.pieces)
    pending: collections.deque[Future] = collections.deque()  # pieces being handed
    decoding: list[Future] = []  # the window's decoding
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
            pieces = iter(window.pieces)
            first = itertools.islice(pieces, ahead)
            pending.extend(_submit(pool, handed, decoder, piece) for piece in first)
            for piece in pieces:
                yield pending.popleft().result()
                pending.append(_submit(pool, handed, decoder, piece))
            seen += window.rows
            if following is not None:  # its memory, once this window's is handed on
                window = following
                decoding = window.decode(decoder, memory, pool)
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
