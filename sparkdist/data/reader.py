"""Streams one rank's shard of the cached Parquet as dicts of numpy arrays, with pyarrow.

Sharding is by row ranges over the files' row groups in a fixed order: shard ``i`` of
``n`` gets rows ``[N*i//n, N*(i+1)//n)``. The shards are disjoint, cover every row exactly
once, and differ by at most one row, whatever the number of files or row groups (so
DDP ranks get the same number of batches in all but edge cases). Reading goes one row
group at a time (``ParquetFile.iter_batches``), never a whole file, in a background
thread that keeps ``prefetch`` batches ready. Arrow data turns into numpy in chunks of
several batches (about ``CHUNK_BYTES``), and batches are views into them: per-batch cost
stays near that of a bare ``iter_batches`` loop.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sparkdist.data import fs

DEFAULT_SHUFFLE_BUFFER_ROWS = 8192
CHUNK_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class ColumnInfo:
    """One column as the readers deliver it.

    kind is "scalar" (numbers, bool), "array" (fixed-length numeric arrays, ``length``
    elements), "string" or "binary". dtype is the numpy dtype name of a value or element.
    """

    name: str
    kind: str
    dtype: str
    length: int | None = None


@dataclass(frozen=True)
class Layout:
    """What a rank needs to find its rows: files, rows per row group, columns. Picklable."""

    file_urls: tuple[str, ...]
    row_group_rows: tuple[tuple[int, ...], ...]
    columns: tuple[ColumnInfo, ...]
    row_bytes: int = 0  # average uncompressed bytes per row, to size read chunks

    @property
    def num_rows(self) -> int:
        return sum(sum(rows) for rows in self.row_group_rows)

    @property
    def num_row_groups(self) -> int:
        return sum(1 for rows in self.row_group_rows for n in rows if n)


def _column_info(field: pa.Field) -> ColumnInfo:
    data_type = field.type
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        element = np.dtype(data_type.value_type.to_pandas_dtype()).name
        return ColumnInfo(field.name, "array", element)
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return ColumnInfo(field.name, "string", "object")
    if pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type):
        return ColumnInfo(field.name, "binary", "object")
    return ColumnInfo(field.name, "scalar", np.dtype(data_type.to_pandas_dtype()).name)


def _open(url: str) -> pq.ParquetFile:
    filesystem, path = fs.filesystem_and_path(url)
    return pq.ParquetFile(filesystem.open_input_file(path))


def _footer(url: str) -> tuple[tuple[int, ...], int]:
    """(rows per row group, uncompressed bytes) of one file."""
    metadata = _open(url).metadata
    groups = [metadata.row_group(i) for i in range(metadata.num_row_groups)]
    return tuple(g.num_rows for g in groups), sum(g.total_byte_size for g in groups)


def describe(dir_url: str) -> Layout:
    """Read the footers of the Parquet files under ``dir_url`` (on the driver, once)."""
    file_urls = fs.list_parquet_files(dir_url)
    if not file_urls:
        raise FileNotFoundError(f"no Parquet files under {dir_url}")
    with ThreadPoolExecutor(max_workers=min(16, len(file_urls))) as pool:
        footers = list(pool.map(_footer, file_urls))
    row_group_rows = tuple(rows for rows, _ in footers)
    total_rows = sum(sum(rows) for rows in row_group_rows)
    row_bytes = sum(size for _, size in footers) // max(total_rows, 1)
    schema = _open(file_urls[0]).schema_arrow
    columns = [_column_info(field) for field in schema]
    array_names = [column.name for column in columns if column.kind == "array"]
    lengths: dict[str, int] = {}
    if array_names:
        for url, rows in zip(file_urls, row_group_rows, strict=True):
            non_empty = [i for i, n in enumerate(rows) if n]
            if non_empty:
                parquet = _open(url)
                first = next(parquet.iter_batches(1, row_groups=non_empty[:1], columns=array_names))
                for name in array_names:
                    value = first.column(name)[0].values
                    lengths[name] = 0 if value is None else len(value)
                break
    columns = [
        ColumnInfo(c.name, c.kind, c.dtype, lengths.get(c.name)) if c.kind == "array" else c
        for c in columns
    ]
    return Layout(tuple(file_urls), row_group_rows, tuple(columns), row_bytes)


def default_shard(cur_shard: int | None, shard_count: int | None) -> tuple[int, int]:
    """(cur_shard, shard_count), defaulting to env RANK / WORLD_SIZE inside a rank."""
    if cur_shard is None and shard_count is None:
        rank, size = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
        if rank is not None and size is not None:
            cur_shard, shard_count = int(rank), int(size)
        else:
            cur_shard, shard_count = 0, 1
    if cur_shard is None or shard_count is None:
        raise ValueError("give both cur_shard and shard_count, or neither")
    if shard_count < 1 or not 0 <= cur_shard < shard_count:
        raise ValueError(f"need 0 <= cur_shard < shard_count, got {cur_shard} of {shard_count}")
    return cur_shard, shard_count


@dataclass(frozen=True)
class Piece:
    """Rows [start, stop) of one row group of one file."""

    file_index: int
    row_group: int
    start: int
    stop: int


def plan_shard(
    row_group_rows: Sequence[Sequence[int]], cur_shard: int, shard_count: int
) -> list[Piece]:
    """The pieces holding rows [N*cur_shard//shard_count, N*(cur_shard+1)//shard_count)."""
    total = sum(sum(rows) for rows in row_group_rows)
    low = total * cur_shard // shard_count
    high = total * (cur_shard + 1) // shard_count
    pieces = []
    offset = 0
    for file_index, rows in enumerate(row_group_rows):
        for row_group, n in enumerate(rows):
            start, stop = max(low - offset, 0), min(high - offset, n)
            if start < stop:
                pieces.append(Piece(file_index, row_group, start, stop))
            offset += n
    return pieces


def _to_numpy(
    name: str, column: pa.Array | pa.ChunkedArray, info: ColumnInfo, writable: bool = False
) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
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
        return values.to_numpy(zero_copy_only=False, writable=writable).reshape(rows, length or 0)
    return column.to_numpy(zero_copy_only=False, writable=writable)


def to_numpy_chunk(
    batch: pa.RecordBatch, columns: Sequence[ColumnInfo], writable: bool = False
) -> dict[str, np.ndarray]:
    """A record batch as {column: numpy array}; arrays come out as (rows, length).

    ``writable`` copies out of Arrow's read-only buffers once per chunk (for torch, which
    wants writable memory) instead of once per batch.
    """
    return {
        info.name: _to_numpy(info.name, batch.column(info.name), info, writable) for info in columns
    }


Chunk = dict[str, np.ndarray]


def _rows(chunk: Chunk) -> int:
    return len(next(iter(chunk.values()))) if chunk else 0


def _cut(chunk: Chunk, start: int, stop: int) -> Chunk:
    return {name: values[start:stop] for name, values in chunk.items()}


def _join(parts: list[Chunk]) -> Chunk:
    if len(parts) == 1:
        return parts[0]
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def _rebatch(chunks: Iterator[Chunk], size: int) -> Iterator[Chunk]:
    """Cut a stream of numpy chunks into batches of exactly ``size`` rows (the last: fewer).

    Batches inside one chunk are views; only a batch that spans two chunks is copied.
    """
    pending: list[Chunk] = []
    count = 0
    for chunk in chunks:
        rows, start = _rows(chunk), 0
        if count:
            start = min(size - count, rows)
            pending.append(_cut(chunk, 0, start))
            count += start
            if count < size:
                continue
            yield _join(pending)
            pending, count = [], 0
        while rows - start >= size:
            yield _cut(chunk, start, start + size)
            start += size
        if start < rows:
            pending, count = [_cut(chunk, start, rows)], rows - start
    if pending:
        yield _join(pending)


def _shuffled(
    batches: Iterator[pa.RecordBatch], capacity: int, rng: np.random.Generator
) -> Iterator[pa.RecordBatch]:
    """Shuffle rows within consecutive blocks of at least ``capacity`` rows."""
    buffer: list[pa.RecordBatch] = []
    count = 0

    def flush() -> Iterator[pa.RecordBatch]:
        table = pa.Table.from_batches(buffer)
        yield from table.take(pa.array(rng.permutation(table.num_rows))).to_batches()

    for batch in batches:
        buffer.append(batch)
        count += batch.num_rows
        if count >= capacity:
            yield from flush()
            buffer, count = [], 0
    if buffer:
        yield from flush()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_DONE = object()


class ShardReader:
    """Iterable over one shard's batches ({column: numpy array}) for ``num_epochs`` epochs.

    ``num_epochs=None`` repeats forever, as in petastorm. Batches run on across epoch
    boundaries; only the very last batch can be short. With ``shuffle`` the order of the
    shard's row groups is drawn anew each epoch and rows are shuffled within blocks of
    ``shuffle_buffer_rows``; the shard itself (which rows) never changes.
    """

    def __init__(
        self,
        layout: Layout,
        *,
        batch_size: int,
        num_epochs: int | None,
        cur_shard: int | None = None,
        shard_count: int | None = None,
        shuffle: bool = False,
        seed: int | None = None,
        shuffle_buffer_rows: int | None = None,
        columns: Sequence[str] | None = None,
        prefetch: int = 2,
        writable: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if num_epochs is not None and num_epochs < 1:
            raise ValueError(f"num_epochs must be None (forever) or at least 1, got {num_epochs}")
        self.cur_shard, self.shard_count = default_shard(cur_shard, shard_count)
        known = {info.name: info for info in layout.columns}
        if columns is not None:
            missing = [name for name in columns if name not in known]
            if missing:
                raise ValueError(f"unknown columns {missing}; the data has {sorted(known)}")
        if columns is not None and not columns:
            raise ValueError("columns=[] selects nothing; give at least one column, or None")
        self.columns = tuple(known[name] for name in (columns or known))
        self.layout = layout
        self.batch_size = batch_size
        self.num_epochs = num_epochs
        self.shuffle = shuffle
        self.shuffle_buffer_rows = shuffle_buffer_rows or DEFAULT_SHUFFLE_BUFFER_ROWS
        self.seed = seed if seed is not None else int(np.random.SeedSequence().entropy % 2**63)
        self.prefetch = prefetch
        self.writable = writable
        self.pieces = plan_shard(layout.row_group_rows, self.cur_shard, self.shard_count)
        self.rows_in_shard = sum(piece.stop - piece.start for piece in self.pieces)
        if num_epochs is None and self.rows_in_shard == 0:
            raise ValueError(
                f"shard {self.cur_shard} of {self.shard_count} has no rows (the data has "
                f"{layout.num_rows}), so num_epochs=None would never yield a batch"
            )
        self._closed = threading.Event()

    def close(self) -> None:
        """Stop every iteration in progress (their background threads end)."""
        self._closed.set()

    def _epoch(self, epoch: int) -> Iterator[pa.RecordBatch]:
        rng = np.random.default_rng([self.seed, epoch, self.cur_shard])
        pieces = list(self.pieces)
        if self.shuffle:
            pieces = [pieces[i] for i in rng.permutation(len(pieces))]
        names = [info.name for info in self.columns]
        batch_bytes = max(self.layout.row_bytes, 1) * self.batch_size
        read_rows = self.batch_size * max(1, min(64, CHUNK_BYTES // batch_bytes))
        opened: tuple[int, pq.ParquetFile] | None = None
        for piece in pieces:
            if opened is None or opened[0] != piece.file_index:
                opened = (piece.file_index, _open(self.layout.file_urls[piece.file_index]))
            offset = 0
            batches = opened[1].iter_batches(read_rows, row_groups=[piece.row_group], columns=names)
            for batch in batches:
                low, high = max(piece.start - offset, 0), min(piece.stop - offset, batch.num_rows)
                if low < high:
                    yield batch if high - low == batch.num_rows else batch.slice(low, high - low)
                offset += batch.num_rows
                if offset >= piece.stop:
                    break

    def _record_batches(self) -> Iterator[pa.RecordBatch]:
        epoch = 0
        while self.num_epochs is None or epoch < self.num_epochs:
            stream = self._epoch(epoch)
            if self.shuffle:
                rng = np.random.default_rng([self.seed, epoch, self.cur_shard, 1])
                stream = _shuffled(stream, self.shuffle_buffer_rows, rng)
            yield from stream
            epoch += 1

    def _batches(self) -> Iterator[dict[str, np.ndarray]]:
        chunks = (
            to_numpy_chunk(batch, self.columns, self.writable) for batch in self._record_batches()
        )
        yield from _rebatch(chunks, self.batch_size)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        if self.prefetch < 1:
            for batch in self._batches():
                if self._closed.is_set():
                    return
                yield batch
            return
        yield from _prefetched(self._batches, self.prefetch, self._closed)


def _prefetched(
    produce: Callable[[], Iterator[object]], depth: int, closed: threading.Event
) -> Iterator:
    """Run ``produce()`` in a thread, ``depth`` items ahead; stops when abandoned or closed."""
    items: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def stopping() -> bool:
        return stop.is_set() or closed.is_set()

    def put(item: object) -> bool:
        while not stopping():
            try:
                items.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in produce():
                if not put(item):
                    return
            put(_DONE)
        except BaseException as error:  # handed to the consumer, raised there
            put(_Failure(error))

    thread = threading.Thread(target=work, name="sparkdist-data-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            try:
                item = items.get(timeout=0.1)
            except queue.Empty:
                if closed.is_set():
                    return
                continue
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item
    finally:
        stop.set()
        thread.join(timeout=10)
