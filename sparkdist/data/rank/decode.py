"""Decodes a rank's windows of the Parquet files into numpy chunks, on the rank.

A window is consecutive row groups of an epoch's order (`sparkdist.data.rank.order`). In the
files' own order its wanted rows are streamed in chunks of about ``chunk_rows`` rows;
shuffled, its row groups are decoded whole and the rows gathered in the epoch's order.
Only the wanted columns are decoded; nulls and ragged arrays are refused by column name;
a `TransformSpec` runs on each chunk. An iteration's chunks (`iteration_chunks`) follow
the plan of each epoch (`order.EpochPlans`: which windows, which rows of them), with the
pad and weight columns marked (`Marks`). Cutting chunks into batches is
`sparkdist.data.rank.batches`.
"""

from __future__ import annotations

import collections
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkdist.data import fs
from sparkdist.data.layout import ColumnInfo, Layout
from sparkdist.data.rank import order, row_block
from sparkdist.data.rank.transform import TransformSpec

Chunk = dict[str, np.ndarray]

# Ends an epoch in a stream of chunks: the batch in progress ends there, short if need be.
EPOCH_END: Chunk = {}


def _rows(chunk: Chunk) -> int:
    return len(next(iter(chunk.values()))) if chunk else 0


def _width(info: ColumnInfo) -> int:
    """Bytes of one row of a column, as decoded (a string's: a guess)."""
    if info.kind in ("string", "binary"):
        return 32
    return np.dtype(info.dtype).itemsize * int(np.prod(info.shape or (info.length or 1,)))


def _to_numpy(
    name: str, column: pa.Array | pa.ChunkedArray, info: ColumnInfo, writable: bool = False
) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):  # a table's column (one chunk: no copy)
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    if column.null_count:
        raise ValueError(
            f"column {name!r} has null values; fill or drop them before make_spark_converter "
            f"(e.g. df.na.drop(subset=[{name!r}]))"
        )
    if info.kind == "array":
        values = column.flatten()
        if values.null_count:
            raise ValueError(f"column {name!r} has arrays with null elements; fill them first")
        rows = len(column)
        length = info.length
        if rows:
            # Every row must hold `length` elements: consecutive offsets `length` apart.
            offsets = column.offsets.to_numpy()
            if length is None:
                length = int(offsets[1] - offsets[0])
            if not (offsets[1:] - offsets[:-1] == length).all():
                lengths = pc.min_max(pc.list_value_length(column)).as_py()
                raise ValueError(
                    f"column {name!r} has arrays of different lengths "
                    f"({lengths['min']}..{lengths['max']}, first row of the data: "
                    f"{info.length}); only fixed-length arrays can be batched"
                )
        return _as_dtype(_numpy(values, writable), info).reshape(rows, length or 0)
    return _as_dtype(_numpy(column, writable), info)


# Arrow's number types as numpy's (``to_pandas_dtype`` would import pandas, 0.2 s, in the
# first chunk of every rank).
_NUMPY_TYPES = {
    pa.from_numpy_dtype(np.dtype(name)): np.dtype(name)
    for name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
    + ("float16", "float32", "float64")
}


def _numpy(array: pa.Array, writable: bool) -> np.ndarray:
    """``array`` as numpy; ``writable`` without a copy where Arrow's memory allows it.

    A number column is viewed in place: a freshly decoded one sits in a mutable buffer
    that only this chunk uses, so a writable view of it is safe; ``to_numpy(writable=True)``
    would copy it (about 10 us a 64 KiB batch, a tenth of the whole per-batch cost), and
    ``to_numpy`` imports pandas (0.2 s, in every rank's first chunk).
    """
    dtype = _NUMPY_TYPES.get(array.type)
    if dtype is not None and not array.null_count:
        data = array.buffers()[1]
        if data is not None and (data.is_mutable or not writable):
            return np.frombuffer(data, dtype, len(array), array.offset * dtype.itemsize)
    return array.to_numpy(zero_copy_only=False, writable=writable)


def _as_dtype(values: np.ndarray, info: ColumnInfo) -> np.ndarray:
    """Cast to the dtype the layout promises (a source file read in place may differ)."""
    if info.kind in ("string", "binary") or values.dtype == np.dtype(info.dtype):
        return values
    return values.astype(info.dtype)


def to_numpy_chunk(
    batch: pa.RecordBatch | pa.Table, columns: Sequence[ColumnInfo], writable: bool = False
) -> Chunk:
    """A record batch (or table) as {column: numpy array}; arrays come out as (rows, length).

    ``writable`` (for torch, which wants writable memory) views Arrow's freshly decoded
    buffers where it can (`_numpy`), else copies once per chunk instead of once per batch.
    """
    return {
        info.name: _to_numpy(info.name, batch.column(info.name), info, writable) for info in columns
    }


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
class WindowDecoder:
    """Reads positions of windows of ``layout``: ``columns`` in, ``output_columns`` out.

    ``transform`` makes ``transformed_columns`` of a chunk; ``stacks`` then stack named
    columns into one array each (`row_block`), in the same pass as a shuffled read's
    gather when there is no transform.
    """

    layout: Layout
    columns: tuple[ColumnInfo, ...]
    transformed_columns: list[ColumnInfo]
    output_columns: list[ColumnInfo]
    transform: TransformSpec | None
    writable: bool
    chunk_rows: int
    stacks: row_block.Stacks = ()
    threads: int = 1  # the threads of the pool ``read`` is given

    @functools.cached_property
    def row_layout(self) -> row_block.RowLayout:
        """Where a shuffled window's columns sit in its rows (the stacks too, if untransformed)."""
        return row_block.RowLayout.of(self.columns, () if self.transform else self.stacks)

    def read(
        self,
        epoch_order: order.EpochOrder,
        window: order.Window,
        ranges: list,
        scratch: Scratch,
        pool: ThreadPoolExecutor | None = None,
        seen: int = 0,
    ) -> Iterator[Chunk]:
        """The rows of ``ranges`` (positions inside ``window``), decoded, in order; ``pool``
        (`threads` threads) decodes and gathers parts of a shuffled window side by side;
        ``seen``: the epoch's rows before them."""
        if epoch_order.shuffle:
            yield from self._read_shuffled(epoch_order, window, ranges, scratch, pool, seen)
            return
        # The files' own order: the ranges' rows of each row group, streamed in one pass.
        for index, run in _runs(ranges, [block.rows for block in window.blocks]):
            yield from self._stream(window.blocks[index], run)

    def _batches(self, block: order.Block, rows: int | None = None) -> Iterator[pa.RecordBatch]:
        """The row group's rows, ``rows`` at a time (Arrow decodes a batch's columns on
        every core: more threads streaming column groups side by side made the in-order
        read slower, 1.6x the loop against 2.0x)."""
        names = [info.name for info in self.columns]
        parquet = fs.open_parquet(self.layout.file_urls[block.file_index])
        yield from parquet.iter_batches(
            rows or self.chunk_rows, row_groups=[block.row_group], columns=names
        )

    def _stream(self, block: order.Block, ranges: list[tuple[int, int]]) -> Iterator[Chunk]:
        """The rows of ``ranges`` (increasing ``[start, stop)`` of one row group), in chunks
        of at most ``chunk_rows``, in one pass over the row group (a per-step split has a
        range a step in it).

        Spark writes row groups of up to 128 MiB: decoding one whole, then copying it for
        torch, costs fresh memory (page faults) that a streaming read reuses, and reads
        the rows after the last range that the rank does not want.
        """
        index, offset = 0, 0
        for batch in self._batches(block):
            end, parts = offset + batch.num_rows, []
            while index < len(ranges) and ranges[index][0] < end:
                lo, hi = ranges[index]
                parts.append((max(lo, offset) - offset, min(hi, end) - offset))
                if hi > end:  # it goes on in the next batch
                    break
                index += 1
            if parts:
                yield self._decode(_picked(batch, parts))
            offset = end
            if index == len(ranges):
                return

    def _decode(self, batch: pa.RecordBatch) -> Chunk:
        writable = self.writable and self.transform is None
        chunk = to_numpy_chunk(batch, self.columns, writable)
        if self.transform is None:
            return row_block.stack_features(chunk, self.stacks, self.output_columns)
        return self._transformed(chunk)

    def _transformed(self, chunk: Chunk) -> Chunk:
        """The transform, then the stacks (a shuffled read without a transform stacked
        them as it gathered)."""
        if self.transform is None:
            return chunk
        chunk = self.transform.apply(chunk, self.transformed_columns, self.writable)
        return row_block.stack_features(chunk, self.stacks, self.output_columns)

    def _read_shuffled(
        self,
        epoch_order: order.EpochOrder,
        window: order.Window,
        ranges: list,
        scratch: Scratch,
        pool: ThreadPoolExecutor | None,
        seen: int = 0,
    ) -> Iterator[Chunk]:
        """Shuffled rows: the window's row groups are decoded whole, the rows gathered in order.

        The row groups are decoded piece by piece into the thread's `Scratch`, reused from
        window to window: a row group decoded at once would take fresh memory (128 MiB for
        Spark's) whose page faults cost as much as the decoding on a busy machine. The
        scalar columns go into a 2-D block per dtype (`row_block`), so a piece of the
        epoch's order is one gather per block for all of its columns. It is
        decoded and gathered in pieces of a quarter chunk (about 2 MiB): 25-40 MiB less
        memory in flight than whole chunks, for about 0.1 CPU s more per 2M rows of
        per-piece work (docs/data.md). A ``pool`` decodes the window's column groups side
        by side, and gathers as many pieces at once as it has threads. The pieces end
        where the epoch's rows (``seen`` before the window) reach a multiple of a piece,
        whole batches of the reader's (so few batches span two pieces: a copy each).
        """
        piece = max(self.chunk_rows // 4, 1)
        permutation = epoch_order.permutation(window)
        if ranges == [(0, window.rows)]:
            rows = permutation
        else:
            rows = np.concatenate([permutation[lo:hi] for lo, hi in ranges])
        blocks, apart, offsets = self._decode_blocks(window, rows, scratch, piece, pool)
        if offsets is not None:  # only some row groups were decoded, one after the other
            bounds = np.cumsum([0] + [block.rows for block in window.blocks])
            rows = rows + offsets[np.searchsorted(bounds, rows, side="right") - 1]
        layout = self.row_layout

        def gathered(picked: np.ndarray) -> Chunk:
            columns = {name: row_block.gather(values, picked) for name, values in apart.items()}
            return self._transformed(layout.split(layout.gather(blocks, picked), columns))

        cuts = [0, *range((-seen) % piece or piece, len(rows), piece), len(rows)]
        pieces = (rows[lo:hi] for lo, hi in zip(cuts, cuts[1:], strict=False))
        yield from _mapped(gathered, pieces, pool, 2 * self.threads)

    def _decode_blocks(
        self,
        window: order.Window,
        rows: np.ndarray,
        scratch: Scratch,
        piece: int,
        pool: ThreadPoolExecutor | None,
    ) -> tuple[row_block.Blocks, Chunk, np.ndarray | None]:
        """The window's row groups that hold ``rows``, decoded into ``scratch``: the
        blocks of the scalar columns, the other columns apart.

        All of them when the rank reads the whole window (no offsets); else those it
        needs, one after the other, with each row group's offset from its place.
        """
        bounds = np.cumsum([0] + [block.rows for block in window.blocks])
        hit = np.arange(len(window.blocks))
        if len(rows) < window.rows and len(window.blocks) > 1:
            hit = np.unique(np.searchsorted(bounds, rows, side="right") - 1)
        total = int(sum(window.blocks[index].rows for index in hit))
        layout = self.row_layout
        blocks = scratch.blocks(layout, total)
        known = {info.name: info for info in self.columns}
        apart = {name: scratch.array(known[name], total) for name in layout.apart}
        offsets, filled = np.zeros(len(window.blocks), dtype=np.int64), 0

        def fill(first: int, chunk: Chunk) -> None:
            start, stop = first, first + _rows(chunk)
            layout.fill(blocks, chunk, start)
            for name in layout.apart:
                if name in chunk:
                    apart[name][start:stop] = chunk[name]

        def fill_columns(block: order.Block, first: int, columns: list[ColumnInfo]) -> None:
            fill(first, self._columns_of(block, columns))  # decoded in the filling thread

        for index in hit:
            block, first = window.blocks[index], filled
            offsets[index] = filled - bounds[index]
            groups = self._column_groups(block)
            if groups is not None:  # all of them at once: a thread done takes another
                task = functools.partial(fill_columns, block, first)
                for _ in pool.map(task, groups) if pool else map(task, groups):
                    pass
            else:  # rows streamed, filled as they come
                for batch in self._batches(block, piece):
                    fill(first, to_numpy_chunk(batch, self.columns))
                    first += batch.num_rows
            filled += block.rows
        return blocks, apart, (offsets if offsets.any() else None)

    def _column_groups(self, block: order.Block) -> list[list[ColumnInfo]] | None:
        """How a row group is decoded: groups of whole columns, about a chunk each, or
        None (rows streamed a piece at a time, all columns).

        Where a column of the row group fits in a chunk (the narrow columns of a wide
        table), some columns are decoded whole at a time: Arrow decodes a call's columns
        on every core, 2x faster than rows streamed a piece at a time, and the columns are
        laid into the window's rows several at once. An array column as wide as the window
        is streamed instead, so that no more than a piece of it is decoded at once.

        The groups are of about equal bytes, at least one a decode thread: a window of one
        row group (Spark's files) cut into a chunk's worth and a remainder kept one thread
        waiting on the other (py-spy: the decode threads idle a third of the time).
        """
        widths = {info.name: _width(info) for info in self.columns}
        budget = self.chunk_rows * sum(widths.values())
        if block.rows * max(widths.values()) > budget:
            return None
        known = {info.name: info for info in self.columns}
        names = self.row_layout.decode_order
        total = block.rows * sum(widths[name] for name in names)
        share = total / max(-(-total // budget), self.threads, 1)
        groups: list[list[ColumnInfo]] = [[]]
        done = 0
        for name in names:
            size = block.rows * widths[name]
            if groups[-1] and done + size / 2 > len(groups) * share:  # past its group's share
                groups.append([])
            groups[-1].append(known[name])
            done += size
        return groups

    def _columns_of(self, block: order.Block, columns: list[ColumnInfo]) -> Chunk:
        """Some columns of a row group, whole (each call opens the file: one per thread)."""
        parquet = fs.open_parquet(self.layout.file_urls[block.file_index])
        table = parquet.read_row_group(block.row_group, columns=[info.name for info in columns])
        return to_numpy_chunk(table, columns)


def _runs(ranges: list, block_rows: Sequence[int]) -> Iterator[tuple[int, list]]:
    """``ranges`` (positions in a window of the files' order) cut at its row groups' edges,
    in order, as runs of increasing ranges inside one row group: ``(row group's index in
    the window, [(start, stop), ...])``; a range that goes back (a pad) starts a new run."""
    bounds = np.cumsum([0, *block_rows]).tolist()
    current, run = -1, []
    for lo, hi in ranges:
        for index in range(len(block_rows)):
            start, stop = max(lo, bounds[index]), min(hi, bounds[index + 1])
            if start >= stop:
                continue
            local = (start - bounds[index], stop - bounds[index])
            if index != current or local[0] < run[-1][1]:
                if run:
                    yield current, run
                current, run = index, []
            run.append(local)
    if run:
        yield current, run


def _picked(batch: pa.RecordBatch, parts: list[tuple[int, int]]) -> pa.RecordBatch:
    """The rows of ``parts`` (increasing ``[lo, hi)``) of ``batch``: a slice if one."""
    if len(parts) == 1:
        lo, hi = parts[0]
        return batch.slice(lo, hi - lo)
    return batch.take(pa.array(np.concatenate([np.arange(lo, hi) for lo, hi in parts])))


@dataclass(frozen=True)
class Marks:
    """The columns an iteration's chunks get besides the data's: ``weights`` (a row's
    weight in its step's mean, with a global batch) and ``pads`` (True on the rows
    repeated to keep the steps equal); None: not asked for."""

    weights: str | None = None
    pads: str | None = None


def iteration_chunks(
    decoder: WindowDecoder,
    plans: Iterator[order.EpochPlan],
    scratch: Scratch,
    marks: Marks,
    convert: Callable[[Chunk], Chunk] | None = None,
) -> Iterator[Chunk]:
    """A reader's decoded chunks of one iteration (``plans``: `order.EpochPlans`), each
    epoch closed by `EPOCH_END`; the decoder's threads share each window's work, and
    ``convert`` (e.g. to petastorm's types) is applied to each chunk once it is marked."""
    for plan in plans:
        chunks = _epoch_chunks(decoder, plan, scratch)
        if marks.weights:
            chunks = mark_weights(chunks, marks.weights, plan)
        if marks.pads:
            chunks = mark_pads(chunks, marks.pads, plan.real)
        yield from chunks if convert is None else map(convert, chunks)
        yield EPOCH_END


def _epoch_chunks(
    decoder: WindowDecoder, plan: order.EpochPlan, scratch: Scratch
) -> Iterator[Chunk]:
    """One epoch's chunks, a window after another; the decoder's threads share each
    shuffled window's work (its column groups, its pieces), so the memory in flight does
    not grow with them. Read in order, a chunk's columns are decoded on every core by
    Arrow."""
    shared = decoder.threads > 1 and plan.order.shuffle
    pool = ThreadPoolExecutor(decoder.threads, "sparkdist-data-decode") if shared else None
    try:
        seen = 0
        for window, ranges in plan.pieces:
            for chunk in decoder.read(plan.order, window, ranges, scratch, pool, seen):
                seen += _rows(chunk)
                yield chunk
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _mapped(
    function: Callable[[Any], Any],
    items: Iterator[Any],
    pool: ThreadPoolExecutor | None,
    ahead: int,
) -> Iterator[Any]:
    """``map(function, items)``, in order; with a ``pool``, ``ahead`` items at a time."""
    if pool is None:
        yield from map(function, items)
        return
    pending: collections.deque = collections.deque()
    try:
        for item in items:
            pending.append(pool.submit(function, item))
            if len(pending) >= ahead:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:  # abandoned: what has not started never runs
            future.cancel()


def mark_pads(chunks: Iterator[Chunk], column: str, own: int) -> Iterator[Chunk]:
    """The chunks of one epoch with ``column`` added: True after the first ``own`` rows.

    Pads (rows repeated for equal steps) end a rank's slice, and each reader (or decode
    worker) streams its rows of the slice in order, so its pads are its last rows.
    """
    seen = 0
    for chunk in chunks:
        rows = _rows(chunk)
        yield {**chunk, column: np.arange(seen, seen + rows) >= own}
        seen += rows


def mark_weights(chunks: Iterator[Chunk], column: str, plan: order.EpochPlan) -> Iterator[Chunk]:
    """The chunks of one epoch with ``column``: each row's weight in its step's mean.

    ``plan`` (an `order.EpochPlan`): the first ``plan.full`` rows are in full steps, the
    rows up to ``plan.real`` in the last step, the rest are pads (weight 0).
    """
    full_weight, last_weight = plan.weights
    seen = 0
    for chunk in chunks:
        index = np.arange(seen, seen + _rows(chunk))
        weights = np.where(index < plan.full, full_weight, last_weight).astype(np.float32)
        weights[index >= plan.real] = 0
        yield {**chunk, column: weights}
        seen += len(index)
