"""Decodes a rank's windows of the Parquet files into numpy chunks, on the rank.

A window is consecutive row groups of an epoch's order (`sparkdist.data.rank.order`).
`WindowDecoder` says what is decoded (the wanted columns, a `TransformSpec` run on each
chunk, `features=` stacks) and streams a window's wanted rows in the files' own order,
in chunks of about ``chunk_rows`` rows (with several decode threads, a group of the
columns a thread: `sparkdist.data.rank.column_streams`); a shuffled window's row groups
are decoded whole and put in the epoch's order by `sparkdist.data.rank.shuffled`. Nulls
and ragged arrays are refused by column name. An iteration's chunks, epoch after epoch, are
`sparkdist.data.rank.epochs`; cutting them into batches, `sparkdist.data.rank.batches`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkdist.data import fs
from sparkdist.data.layout import ColumnInfo, Layout
from sparkdist.data.rank import chunk_ring, column_streams, order, row_block
from sparkdist.data.rank.transform import TransformSpec

Chunk = dict[str, np.ndarray]

# Ends an epoch in a stream of chunks: the batch in progress ends there, short if need be.
EPOCH_END: Chunk = {}


def width(info: ColumnInfo) -> int:
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


@dataclass(frozen=True)
class WindowDecoder:
    """Reads positions of windows of ``layout``: ``columns`` in, ``output_columns`` out.

    ``transform`` makes ``transformed_columns`` of a chunk; ``stacks`` then stack named
    columns into one array each (`row_block`), as a shuffled read hands each piece out
    when there is no transform.
    """

    layout: Layout
    columns: tuple[ColumnInfo, ...]
    transformed_columns: list[ColumnInfo]
    output_columns: list[ColumnInfo]
    transform: TransformSpec | None
    writable: bool
    chunk_rows: int
    stacks: row_block.Stacks = ()
    threads: int = 1  # the decode threads (or processes) that share a shuffled window
    processes: bool = False  # decode processes, not threads (`decode_processes`)
    # Where a shuffled read hands out a piece of (bytes, rows) (a device feed's ring slot;
    # `sparkdist.data.rank.device_feed`); None: fresh memory.
    memory: Callable[[int, int], Any] | None = None

    @functools.cached_property
    def row_layout(self) -> row_block.RowLayout:
        """Where a shuffled window's columns sit in its rows (the stacks too, if untransformed)."""
        return row_block.RowLayout.of(self.columns, () if self.transform else self.stacks)

    def read(
        self, windows: Iterable[tuple[order.Window, list]], pool: ThreadPoolExecutor | None
    ) -> Iterator[Chunk]:
        """The rows of each ``(window, ranges)`` (positions inside a window of the files'
        own order), decoded: each row group's wanted rows streamed in one pass, in this
        thread, or with ``pool``, a group of the columns a thread (`column_streams`)."""
        runs = [
            (window.blocks[index], run)
            for window, ranges in windows
            for index, run in _runs(ranges, [block.rows for block in window.blocks])
        ]
        widths = {info.name: width(info) for info in self.columns}
        count = min(self.threads, len(widths))
        groups = column_streams.column_groups(widths, count) if pool else []
        if len(groups) < 2:
            for block, run in runs:
                yield from self._stream(run, self.batches(block))
            return
        wanted = [(self.layout.file_urls[b.file_index], b.row_group, r[-1][1]) for b, r in runs]
        with column_streams.ColumnStreams(wanted, self.chunk_rows, groups, pool) as streams:
            for (_, run), batches in zip(runs, streams.row_groups(), strict=True):
                yield from self._stream(run, batches)
                column_streams.drained(batches)

    def batches(self, block: order.Block, rows: int | None = None) -> Iterator[pa.RecordBatch]:
        """The row group's rows, ``rows`` at a time, a batch's columns decoded in Arrow's
        own pool (decoded in this thread instead, where that pool has one thread, the read
        was no faster and held 32 MiB more: 2M rows of 64 columns)."""
        names = [info.name for info in self.columns]
        parquet = fs.open_parquet(self.layout.file_urls[block.file_index])
        yield from parquet.iter_batches(
            rows or self.chunk_rows, row_groups=[block.row_group], columns=names
        )

    def _stream(
        self, ranges: list[tuple[int, int]], batches: Iterator[pa.RecordBatch]
    ) -> Iterator[Chunk]:
        """The rows of ``ranges`` (increasing ``[start, stop)`` of one row group), in chunks
        of at most ``chunk_rows``, in one pass over the row group's ``batches`` (a
        per-step split has a range a step in it).

        Spark writes row groups of up to 128 MiB: decoding one whole, then copying it for
        torch, costs fresh memory (page faults) that a streaming read reuses, and reads
        the rows after the last range that the rank does not want.
        """
        index, offset = 0, 0
        for batch in batches:
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
            alloc = self._memory(chunk) if self.stacks else row_block.fresh
            return row_block.stack_features(chunk, self.stacks, self.output_columns, alloc)
        return self.transformed(chunk)

    def _memory(self, chunk: Chunk) -> row_block.Alloc:
        """Where a chunk read in order is stacked: the ``memory`` (a device feed's slot,
        with room for the chunk's other columns, packed after it), else fresh memory."""
        if self.memory is None:
            return row_block.fresh
        rows = len(next(iter(chunk.values())))
        nbytes = chunk_ring.room_for(values.nbytes for values in chunk.values())
        return self.memory(nbytes, rows).carve

    def transformed(self, chunk: Chunk) -> Chunk:
        """The transform, then the stacks (a shuffled read without a transform stacked
        them as it handed the piece out)."""
        if self.transform is None:
            return chunk
        chunk = self.transform.apply(chunk, self.transformed_columns, self.writable)
        return row_block.stack_features(chunk, self.stacks, self.output_columns)


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
