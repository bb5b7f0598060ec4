"""A shuffled epoch's windows, read on the decode threads with one window of buffers.

A window's rows are permuted across the whole window (`sparkdist.data.rank.order`), so its
first piece needs every row: a window's row groups are decoded whole into the reader's
`Scratch` (a column group a task, side by side on the decode threads), then its rows are
gathered in the epoch's order a piece at a time into fresh memory that is handed out
(`row_block`). The scratch is needed only until the window's last piece is gathered, not
until that piece is handed out: the next window is decoded then, and its first pieces
gathered once it is, each step started by the decode thread that ends the one before,
while the thread that reads ahead still hands out the pieces gathered ahead
(`shuffled_chunks`). So the decode threads do not wait between windows for the reading
thread to hand out a window's last pieces, plan the next one and come back for its first
(where their time went before: docs/data.md, "Wide tables"), and the read still holds
one window of buffers: a scratch is reused only once nothing gathers from it, and
nothing handed out is a view of it.
"""

from __future__ import annotations

import collections
import functools
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from sparkdist.data import fs
from sparkdist.data.layout import ColumnInfo
from sparkdist.data.rank import chunk_ring, order, row_block
from sparkdist.data.rank.decode import Chunk, WindowDecoder, to_numpy_chunk, width

Fill = Callable[[int, Chunk], None]  # writes a chunk into a window's rows from a row on


class Scratch(threading.local):
    """A thread's buffers that shuffled windows are decoded into, kept for the next window:
    the window's scalar columns as a 2-D block a run (`row_block.RowLayout`), its other
    columns an array each."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.held: list[np.ndarray] = []

    def array(self, info: ColumnInfo, rows: int) -> np.ndarray:
        """``rows`` rows of column ``info``, from the held array if it fits."""
        shape = (info.length or 0,) if info.kind == "array" else ()
        dtype = np.dtype(object if info.kind in ("string", "binary") else info.dtype)
        held = self.arrays.get(info.name)
        if held is None or len(held) < rows or held.shape[1:] != shape or held.dtype != dtype:
            held = self.arrays[info.name] = np.empty((rows, *shape), dtype)
        return held[:rows]

    def blocks(self, layout: row_block.RowLayout, rows: int) -> row_block.Blocks:
        """Each run's block of ``rows`` rows, contiguous (``np.take`` copies a strided
        one whole), in the held bytes where they fit."""
        while len(self.held) < len(layout.runs):
            self.held.append(np.empty(0, np.uint8))
        out = []
        for index, run in enumerate(layout.runs):
            shape = run.shape(rows)
            size = shape[0] * shape[1] * run.dtype.itemsize
            if len(self.held[index]) < size:
                self.held[index] = np.empty(size, np.uint8)
            out.append(self.held[index][:size].view(run.dtype).reshape(shape))
        return tuple(out)


@dataclass(frozen=True)
class PlannedWindow:
    """A shuffled window, planned: ``tasks`` decode its row groups into ``blocks`` and
    ``apart`` (the scratch's), and the rows at positions ``cuts[i]:cuts[i + 1]`` of
    ``rows`` (indices into the decoded rows, in the epoch's order) are its ``i``-th piece."""

    rows: np.ndarray
    blocks: row_block.Blocks
    apart: Chunk
    cuts: list[int]
    tasks: list[Callable[[], None]]

    def pieces(self) -> Iterator[np.ndarray]:
        return (self.rows[lo:hi] for lo, hi in itertools.pairwise(self.cuts))


def plan_window(
    decoder: WindowDecoder,
    epoch_order: order.EpochOrder,
    window: order.Window,
    ranges: list,
    scratch: Scratch,
    seen: int,
) -> PlannedWindow:
    """The rows of ``ranges`` (positions inside ``window``) in the epoch's order, and the
    work that decodes the window's row groups that hold them into ``scratch``: all of them
    when the rank reads the whole window, else those it needs, one after the other.

    A window is decoded and gathered in pieces of a quarter chunk (about 2 MiB): 25-40 MiB
    less memory in flight than whole chunks (docs/data.md). The pieces end where the
    epoch's rows (``seen`` before the window) reach a multiple of a piece, whole batches
    of the reader's (so few batches span two pieces: a copy each).
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
    total = int(sum(window.blocks[index].rows for index in hit))
    layout = decoder.row_layout
    blocks = scratch.blocks(layout, total)
    known = {info.name: info for info in decoder.columns}
    apart = {name: scratch.array(known[name], total) for name in layout.apart}
    fill = functools.partial(_fill, layout, blocks, apart)
    footers: dict[str, object] = {}  # each file's, read once by the window's tasks
    offsets, filled, tasks = np.zeros(len(window.blocks), dtype=np.int64), 0, []
    for index in hit:
        offsets[index] = filled - bounds[index]
        block = window.blocks[index]
        groups = column_groups(decoder, block)
        if groups is None:  # rows streamed, filled as they come
            tasks.append(functools.partial(_stream_into, decoder, block, piece, fill, filled))
        else:  # a task a column group, all of the window's at once: a thread done takes another
            task = functools.partial(_columns_into, decoder, block, fill, filled, footers)
            tasks += [functools.partial(task, group) for group in groups]
        filled += block.rows
    if offsets.any():  # only some row groups were decoded, one after the other
        rows = rows + offsets[np.searchsorted(bounds, rows, side="right") - 1]
    cuts = [0, *range((-seen) % piece or piece, len(rows), piece), len(rows)]
    return PlannedWindow(rows, blocks, apart, cuts, tasks)


def _fill(
    layout: row_block.RowLayout, blocks: row_block.Blocks, apart: Chunk, first: int, chunk: Chunk
) -> None:
    """Write ``chunk``'s columns into the window's rows from ``first`` on."""
    stop = first + (len(next(iter(chunk.values()))) if chunk else 0)
    layout.fill(blocks, chunk, first)
    for name in layout.apart:
        if name in chunk:
            apart[name][first:stop] = chunk[name]


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
    table = parquet.read_row_group(block.row_group, columns=[info.name for info in columns])
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
    names = decoder.row_layout.decode_order
    total = block.rows * sum(widths[name] for name in names)
    share = total / max(-(-total * 4 // budget), decoder.threads, 1)
    groups: list[list[ColumnInfo]] = [[]]
    done = 0
    for name in names:
        size = block.rows * widths[name]
        if groups[-1] and done + size / 2 > len(groups) * share:  # past its group's share
            groups.append([])
        groups[-1].append(known[name])
        done += size
    return groups


def gather(decoder: WindowDecoder, window: PlannedWindow, picked: np.ndarray) -> Chunk:
    """The decoded rows ``picked`` of ``window``, in that order, as a chunk of fresh memory,
    or of the decoder's ``memory`` (a device feed's slot) where no transform follows
    (transformed and stacked as the decoder says)."""
    layout, alloc = decoder.row_layout, row_block.fresh
    if decoder.memory is not None and decoder.transform is None:
        nbytes = chunk_ring.room_for(layout.gathered_sizes(window.apart, len(picked)))
        alloc = decoder.memory(nbytes, len(picked)).carve
    apart = window.apart.items()
    columns = {name: row_block.gather(values, picked, alloc) for name, values in apart}
    return decoder.transformed(layout.split(layout.gather(window.blocks, picked, alloc), columns))


def shuffled_chunks(
    decoder: WindowDecoder,
    plan: order.EpochPlan,
    scratch: Scratch,
    pool: ThreadPoolExecutor | None,
) -> Iterator[Chunk]:
    """One shuffled epoch's chunks, window after window, gathered ``2 * threads`` pieces
    ahead on ``pool``. Once a window's last piece is gathered, the next window is decoded
    into the same scratch and its first pieces gathered, by the decode threads as each
    step ends (`_Work.later`), while this window's last pieces are still handed out.
    Without a pool, the same steps run one after the other in this thread."""
    work = _Work(pool)
    ahead = 2 * decoder.threads if pool is not None else 1
    windows = list(plan.pieces)
    pending: collections.deque[Future] = collections.deque()
    try:
        if windows:
            first = plan_window(decoder, plan.order, *windows[0], scratch, 0)
            started = _start(work, decoder, first, [], ahead)
        seen = 0
        for index in range(len(windows)):
            current, decoding, pieces, gathering = started
            pending.extend(gathering)
            following = None
            if index + 1 < len(windows):  # planned while this window is decoded
                rows = seen + len(current.rows)
                following = plan_window(decoder, plan.order, *windows[index + 1], scratch, rows)
            for future in decoding:  # a decoding error is raised before any piece
                future.result()
            more = itertools.islice(pieces, ahead - len(pending))  # the first were gathering
            pending.extend(work.submit(gather, decoder, current, picked) for picked in more)
            for picked in pieces:
                yield pending.popleft().result()
                pending.append(work.submit(gather, decoder, current, picked))
            if following is not None:  # once nothing gathers from the scratch
                started = _start(work, decoder, following, list(pending), decoder.threads)
            while pending:
                yield pending.popleft().result()
            seen += len(current.rows)
    finally:
        work.stop()  # what waits on another step never starts
        for future in pending:
            future.cancel()


def _start(
    work: _Work, decoder: WindowDecoder, window: PlannedWindow, after: list[Future], count: int
) -> tuple[PlannedWindow, list[Future], Iterator[np.ndarray], list[Future]]:
    """Decode ``window`` once all of ``after`` are done, then gather its first ``count``
    pieces: (the window, its decoding, its pieces left, the pieces being gathered)."""
    decoding = [work.later(after, task) for task in window.tasks]
    pieces = window.pieces()
    picked = itertools.islice(pieces, count)
    return (
        window,
        decoding,
        pieces,
        [work.later(decoding, gather, decoder, window, p) for p in picked],
    )


class _Work:
    """Runs a shuffled read's tasks on the decode threads' ``pool``, or (None) at once in
    the calling thread."""

    def __init__(self, pool: ThreadPoolExecutor | None) -> None:
        self.pool = pool
        self.stopped = False

    def submit(self, function: Callable, *args: object) -> Future:
        if self.pool is not None:
            return self.pool.submit(function, *args)
        future: Future = Future()
        try:
            future.set_result(function(*args))
        except Exception as error:  # raised where the result is asked for, as a pool's is
            future.set_exception(error)
        return future

    def later(self, first: Sequence[Future], function: Callable, *args: object) -> Future:
        """A future of ``function(*args)``, submitted once all of ``first`` are done, by
        the thread that finished the last of them: no thread waits for them."""
        proxy: Future = Future()

        def start() -> None:
            if self.stopped or not proxy.set_running_or_notify_cancel():
                return  # the read ended, or gave this step up
            try:
                self.submit(function, *args).add_done_callback(functools.partial(_copy, proxy))
            except RuntimeError as error:  # the pool was shut down as the read ended
                proxy.set_exception(error)

        _when_all(first, start)
        return proxy

    def stop(self) -> None:
        self.stopped = True


def _when_all(futures: Sequence[Future], then: Callable[[], None]) -> None:
    """Call ``then()`` once every one of ``futures`` is done (at once if none is left)."""
    left, lock = [len(futures)], threading.Lock()

    def one_done(_: Future) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            then()

    if not futures:
        then()
    for future in futures:
        future.add_done_callback(one_done)


def _copy(proxy: Future, done: Future) -> None:
    """``proxy`` gets ``done``'s outcome."""
    if done.cancelled():
        proxy.set_exception(CancelledError())
    elif done.exception() is not None:
        proxy.set_exception(done.exception())
    else:
        proxy.set_result(done.result())
