"""Streams one rank's rows of the Parquet files as dicts of numpy arrays, with pyarrow.

Which rows, in which order, is `sparkdist.data.order`: rank ``r`` of ``W`` reads its equal
slice of each epoch's global order, from a position that survives relaunches and
resizes. Here the slice is read window by window (consecutive row groups of that order),
only the wanted columns, decoded into numpy chunks of about 8 MiB: in the files' order the
wanted rows are streamed; shuffled, a window's row groups are decoded whole and its rows
gathered in the epoch's order. Batches are views into the chunks, so the per-batch cost
stays near that of a bare pyarrow loop. Reading and decoding run in a
background thread ``prefetch`` chunks (about 8 MiB each) ahead, so the hand-off between
threads is paid per chunk, not per batch; ``workers_count`` windows can be read at once.
"""

from __future__ import annotations

import collections
import itertools
import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sparkdist.data import fs, order
from sparkdist.data.columns import ColumnInfo
from sparkdist.data.transform import TransformSpec


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
    source = filesystem.open_input_file(path)
    if isinstance(filesystem, pafs.LocalFileSystem):
        # Local and FUSE-mounted files (/dbfs, /Volumes): pages stream through a 1 MiB
        # buffer as they are decoded, instead of a whole column chunk (128 MiB in a Spark
        # row group) read into fresh memory first: half the memory, and no slower.
        return pq.ParquetFile(source, pre_buffer=False, buffer_size=1 << 20)
    return pq.ParquetFile(source)  # object stores: whole column chunks in few requests


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


def _to_numpy(name: str, column: pa.Array, info: ColumnInfo, writable: bool = False) -> np.ndarray:
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


def _numpy(array: pa.Array, writable: bool) -> np.ndarray:
    """``array`` as numpy; ``writable`` without a copy where Arrow's memory allows it.

    A freshly decoded number column sits in a mutable buffer that only this chunk uses,
    so a writable view of it is safe; ``to_numpy(writable=True)`` would copy it (about
    10 us a 64 KiB batch, a tenth of the whole per-batch cost).
    """
    kind = array.type
    if (
        writable
        and not array.null_count
        and (pa.types.is_integer(kind) or pa.types.is_floating(kind))
    ):
        data = array.buffers()[1]
        if data is not None and data.is_mutable:
            dtype = np.dtype(kind.to_pandas_dtype())
            return np.frombuffer(data, dtype, len(array), array.offset * dtype.itemsize)
    return array.to_numpy(zero_copy_only=False, writable=writable)


def _as_dtype(values: np.ndarray, info: ColumnInfo) -> np.ndarray:
    """Cast to the dtype the layout promises (a source file read in place may differ)."""
    if info.kind in ("string", "binary") or values.dtype == np.dtype(info.dtype):
        return values
    return values.astype(info.dtype)


def to_numpy_chunk(
    batch: pa.RecordBatch, columns: Sequence[ColumnInfo], writable: bool = False
) -> dict[str, np.ndarray]:
    """A record batch as {column: numpy array}; arrays come out as (rows, length).

    ``writable`` (for torch, which wants writable memory) views Arrow's freshly decoded
    buffers where it can (`_numpy`), else copies once per chunk instead of once per batch.
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


# Ends an epoch in a stream of chunks: the batch in progress ends there, short if need be.
EPOCH_END: Chunk = {}


def _rebatch(chunks: Iterator[Chunk], size: int) -> Iterator[Chunk]:
    """Cut a stream of numpy chunks into batches of exactly ``size`` rows.

    Batches inside one chunk are views; only a batch that spans two chunks is copied.
    The last batch before an `EPOCH_END` (and at the end of the stream) can be shorter:
    batches never span two epochs.
    """
    pending: list[Chunk] = []
    count = 0
    for chunk in chunks:
        if chunk is EPOCH_END:
            if pending:
                yield _join(pending)
            pending, count = [], 0
            continue
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


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_DONE = object()

# Uncompressed bytes a rank decodes at once from a row group read in file order.
CHUNK_BYTES = 8 << 20


class _Scratch(threading.local):
    """A thread's arrays that shuffled windows are decoded into, kept for the next window."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def array(self, name: str, like: np.ndarray, rows: int) -> np.ndarray:
        """``rows`` rows shaped and typed like ``like``, from the held array if it fits."""
        held = self.arrays.get(name)
        if (
            held is None
            or len(held) < rows
            or held.shape[1:] != like.shape[1:]
            or held.dtype != like.dtype
        ):
            held = self.arrays[name] = np.empty((rows, *like.shape[1:]), like.dtype)
        return held[:rows]


def wanted_intervals(
    rank_slice: Sequence[order.Interval],
    batch_size: int,
    worker: int,
    workers: int,
    batches_before: int = 0,
) -> list[order.Interval]:
    """The part of a rank's slice that decode worker ``worker`` of ``workers`` reads.

    Worker ``w`` makes the rank's batches ``w, w + workers, ...`` of the iteration (the
    epoch's batch ``k`` is the iteration's ``batches_before + k``), the order in which
    ``torch.utils.data.DataLoader`` takes them from its workers, so together they yield
    the rank's batches in order, each row once.
    """
    if workers == 1:
        return list(rank_slice)
    rows = order.total(rank_slice)
    first = (worker - batches_before) % workers
    out: list[order.Interval] = []
    for start in range(first * batch_size, rows, workers * batch_size):
        out += order.take(rank_slice, start, min(start + batch_size, rows))
    return out


class ShardReader:
    """Iterable over one rank's batches ({column: numpy array}), epoch after epoch.

    Each iteration reads ``num_epochs`` epochs (``None``: forever) from `position`, the
    world's place in the data (see `sparkdist.data.order`): rank ``cur_shard`` of
    ``shard_count`` reads its equal slice of what is left of each epoch's global order.
    The last batch of an epoch can be short (the same length on every rank); batches never
    span two epochs. ``shuffle`` draws a new global order each epoch from ``seed``, with
    rows mixed within windows of ``shuffle_buffer_rows``. ``workers_count`` threads read
    and decode windows in parallel (in order); ``transform`` (a `TransformSpec`) is applied
    to each decoded chunk as a pandas DataFrame.
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
        drop_last: bool = False,
        workers_count: int | None = None,
        transform: TransformSpec | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if num_epochs is not None and num_epochs < 1:
            raise ValueError(f"num_epochs must be None (forever) or at least 1, got {num_epochs}")
        if workers_count is not None and workers_count < 1:
            raise ValueError(f"workers_count must be None or at least 1, got {workers_count}")
        self.cur_shard, self.shard_count = default_shard(cur_shard, shard_count)
        known = {info.name: info for info in layout.columns}
        if columns is not None:
            missing = [name for name in columns if name not in known]
            if missing:
                raise ValueError(f"unknown columns {missing}; the data has {sorted(known)}")
        if columns is not None and not columns:
            raise ValueError("columns=[] selects nothing; give at least one column, or None")
        self.transform = transform
        if transform is not None:
            columns = transform.input_columns(columns or list(known), known)
        self.columns = tuple(known[name] for name in (columns or known))
        self.output_columns = (
            transform.output_columns(self.columns) if transform else list(self.columns)
        )
        self.layout = layout
        self.batch_size = batch_size
        self.num_epochs = num_epochs
        self.shuffle = shuffle
        self.window_rows = shuffle_buffer_rows or order.DEFAULT_WINDOW_ROWS
        self.prefetch = prefetch
        self.writable = writable
        self.workers_count = workers_count or 1
        self.position = order.Position(
            layout.num_rows,
            seed=0 if seed is None else int(seed),
            rank=self.cur_shard,
            world=self.shard_count,
            batch_size=batch_size,
            drop_last=drop_last,
        )
        if num_epochs is None and self.position.batches_in_epoch() == 0:
            raise ValueError(
                f"rank {self.cur_shard} of {self.shard_count} has no rows (the data has "
                f"{layout.num_rows}), so num_epochs=None would never yield a batch"
            )
        self._closed = threading.Event()
        self._scratch = _Scratch()
        self._started: order.Position | None = None  # where the current iteration began
        self._taken: order.Position | None = None  # an `iteration_apart`'s own count

    @property
    def rows_in_shard(self) -> int:
        """Rows this rank reads in the current epoch (the same on every rank)."""
        return order.total(self.position.slice())

    def batches_per_epoch(self) -> int:
        """Batches each rank gets in the current epoch (from the current position)."""
        return self.position.batches_in_epoch()

    def batches_per_iteration(self, start: order.Position | None = None) -> int:
        """Batches one iteration yields from ``start`` (default: the current position)."""
        if self.num_epochs is None:
            raise TypeError("num_epochs=None repeats forever: the loader has no length")
        position = (start or self.position).copy()
        position.settle()
        count = 0
        for _ in range(self.num_epochs):
            count += position.batches_in_epoch()
            position.next_epoch()
        return count

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_closed"] = state["_scratch"] = None  # thread state: a copy gets its own
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._closed = threading.Event()
        self._scratch = _Scratch()

    def state_dict(self, steps: int | None = None) -> dict:
        """The world's position (epoch, rows consumed, seed): small, picklable.

        By default, after the batches handed out so far. ``steps=n``: after the first ``n``
        batches of the current iteration (of the next one, if none has started), whatever
        was taken ahead of them: exact where a pipeline such as tf.data's prefetch takes
        batches before the training step uses them.
        """
        if steps is None:
            return (self._taken or self.position).state_dict()
        start = self._started or self.position
        limit = None if self.num_epochs is None else self.batches_per_iteration(start)
        if steps < 0 or (limit is not None and steps > limit):
            raise ValueError(
                f"steps={steps}: an iteration of this loader has "
                f"{'unlimited' if limit is None else limit} batches"
            )
        position = start.copy()
        position.settle()
        for _ in self._counted(itertools.repeat(None, steps), position):
            pass
        return position.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (from `state_dict`, any world size) at the next iteration."""
        self.position.load_state_dict(state)
        self._started = self._taken = None

    def close(self) -> None:
        """Stop every iteration in progress (their background threads end)."""
        self._closed.set()

    # -- producing (may run in a background thread or a DataLoader worker) --

    def _plan(
        self, worker: int, workers: int, start: order.Position | None
    ) -> Iterator[tuple[order.EpochOrder, list]]:
        """(epoch order, pieces this worker reads) per epoch of one iteration."""
        position = (start or self.position).copy()
        epochs = batches = 0
        while self.num_epochs is None or epochs < self.num_epochs:
            epoch_order = order.EpochOrder(
                self.layout.row_group_rows,
                position.seed,
                position.epoch,
                self.shuffle,
                self.window_rows,
            )
            own = position.slice()
            wanted = wanted_intervals(own, self.batch_size, worker, workers, batches)
            yield epoch_order, _by_window(epoch_order.pieces(wanted))
            batches += position.batches_in_epoch()
            position.next_epoch()
            epochs += 1

    def _read(
        self, epoch_order: order.EpochOrder, window: order.Window, ranges: list
    ) -> Iterator[Chunk]:
        """The rows of ``ranges`` (positions inside ``window``), decoded, in order."""
        if epoch_order.shuffle:
            yield from self._read_shuffled(epoch_order, window, ranges)
            return
        # The files' own order: each range is a run of consecutive rows, streamed.
        bounds = np.cumsum([0] + [block.rows for block in window.blocks])
        for lo, hi in ranges:
            for index, block in enumerate(window.blocks):
                start, stop = max(lo, bounds[index]), min(hi, bounds[index + 1])
                if start < stop:
                    yield from self._stream(block, start - bounds[index], stop - bounds[index])

    def _stream(self, block: order.Block, start: int, stop: int) -> Iterator[Chunk]:
        """Rows ``[start, stop)`` of one row group, in chunks of about `CHUNK_BYTES`.

        Spark writes row groups of up to 128 MiB: decoding one whole, then copying it for
        torch, costs fresh memory (page faults) that a streaming read reuses, and reads
        the rows after ``stop`` that the rank does not want.
        """
        names = [info.name for info in self.columns]
        parquet = _open(self.layout.file_urls[block.file_index])
        offset = 0
        for batch in parquet.iter_batches(
            self._chunk_rows, row_groups=[block.row_group], columns=names
        ):
            rows = batch.num_rows
            lo, hi = max(start - offset, 0), min(stop - offset, rows)
            if lo < hi:
                yield self._decode(batch.slice(lo, hi - lo))
            offset += rows
            if offset >= stop:
                return

    @property
    def _chunk_rows(self) -> int:
        return max(self.batch_size, CHUNK_BYTES // max(self.layout.row_bytes, 1), 1)

    def _decode(self, batch: pa.RecordBatch) -> Chunk:
        writable = self.writable and self.transform is None
        return self._transformed(to_numpy_chunk(batch, self.columns, writable))

    def _transformed(self, chunk: Chunk) -> Chunk:
        if self.transform is None:
            return chunk
        return self.transform.apply(chunk, self.output_columns, self.writable)

    def _read_shuffled(
        self, epoch_order: order.EpochOrder, window: order.Window, ranges: list
    ) -> Iterator[Chunk]:
        """Shuffled rows: the window's row groups are decoded whole, the rows gathered in order.

        The row groups are decoded chunk by chunk into this thread's `_Scratch` arrays,
        reused from window to window: a row group decoded at once would take fresh memory
        (128 MiB for Spark's) whose page faults cost as much as the decoding on a busy
        machine. The gather is made in chunks of about `CHUNK_BYTES`.
        """
        permutation = epoch_order.permutation(window)
        rows = np.concatenate([permutation[lo:hi] for lo, hi in ranges])
        bounds = np.cumsum([0] + [block.rows for block in window.blocks])
        hit = np.unique(np.searchsorted(bounds, rows, side="right") - 1)
        names = [info.name for info in self.columns]
        total = sum(window.blocks[index].rows for index in hit)
        decoded: Chunk = {}
        offsets, filled = np.zeros(len(window.blocks), dtype=np.int64), 0
        for index in hit:
            block = window.blocks[index]
            offsets[index] = filled - bounds[index]
            parquet = _open(self.layout.file_urls[block.file_index])
            for batch in parquet.iter_batches(
                self._chunk_rows, row_groups=[block.row_group], columns=names
            ):
                for name, values in to_numpy_chunk(batch, self.columns).items():
                    if name not in decoded:
                        decoded[name] = self._scratch.array(name, values, total)
                    decoded[name][filled : filled + len(values)] = values
                filled += batch.num_rows
        local = rows + offsets[np.searchsorted(bounds, rows, side="right") - 1]
        for start in range(0, len(local), self._chunk_rows):
            picked = local[start : start + self._chunk_rows]
            yield self._transformed({name: values[picked] for name, values in decoded.items()})

    def _read_all(
        self, epoch_order: order.EpochOrder, window: order.Window, ranges: list
    ) -> list[Chunk]:
        return list(self._read(epoch_order, window, ranges))

    def _epoch_chunks(self, epoch_order: order.EpochOrder, pieces: list) -> Iterator[Chunk]:
        if self.workers_count == 1:
            for window, ranges in pieces:
                yield from self._read(epoch_order, window, ranges)
            return
        with ThreadPoolExecutor(self.workers_count, "sparkdist-data-decode") as pool:
            pending: collections.deque = collections.deque()
            for window, ranges in pieces:
                pending.append(pool.submit(self._read_all, epoch_order, window, ranges))
                if len(pending) > self.workers_count:
                    yield from pending.popleft().result()
            while pending:
                yield from pending.popleft().result()

    def _chunks(self, worker: int, workers: int, start: order.Position | None) -> Iterator[Chunk]:
        """This worker's decoded chunks of one iteration, each epoch closed by `EPOCH_END`."""
        for epoch_order, pieces in self._plan(worker, workers, start):
            yield from self._epoch_chunks(epoch_order, pieces)
            yield EPOCH_END

    def batches(
        self, worker: int = 0, workers: int = 1, start: order.Position | None = None
    ) -> Iterator[Chunk]:
        """This worker's batches of one iteration.

        With ``prefetch``, a thread reads and decodes the chunks ahead; the batches are cut
        from them here, in the consumer's thread, so the threads meet once per chunk.
        """
        if self.prefetch < 1:
            chunks = self._chunks(worker, workers, start)
        else:
            chunks = prefetched(
                lambda: self._chunks(worker, workers, start), self.prefetch, self._closed
            )
        return _rebatch(chunks, self.batch_size)

    # -- consuming (counts what the user got, for state_dict) --

    def count(self, batches: Iterator[Chunk]) -> Iterator[Chunk]:
        """Pass the iteration's batches on, moving the position one batch at a time."""
        self._started = self.position.copy()
        return self._counted(batches, self.position)

    def _counted(self, batches: Iterator[Any], position: order.Position) -> Iterator[Any]:
        epochs = 0

        def next_epoch() -> bool:
            nonlocal epochs
            position.next_epoch()
            epochs += 1
            return self.num_epochs is None or epochs < self.num_epochs

        go_on = True
        while go_on and position.batches_in_epoch() == 0:
            go_on = next_epoch()
        in_epoch = position.batches_in_epoch()
        for batch in batches:
            # Counted when handed out, so that state_dict() in the loop body includes it.
            position.batches += 1
            while go_on and position.batches >= in_epoch:
                go_on = next_epoch()
                in_epoch = position.batches_in_epoch()
            yield batch

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        self.position.settle()
        for batch in self.count(self.batches()):
            if self._closed.is_set():
                return
            yield batch

    def iteration_apart(self) -> Iterator[dict[str, np.ndarray]]:
        """One iteration that moves the position only if it runs to its end (for tf.data).

        tf.data takes batches ahead, and tf.distribute and Keras drop an iterator after
        taking some to look at a dataset: the next iteration starts where such a one did,
        so no row is skipped. It counts on its own; `state_dict(steps=n)` counts from its
        start, and a later iteration supersedes it.
        """
        start = self.position.copy()
        start.settle()
        taken = start.copy()
        self._started, self._taken = start, taken
        for batch in self._counted(self.batches(start=start), taken):
            if self._closed.is_set():
                return
            yield batch
        if self._taken is taken:  # still the latest iteration, and it ran to its end
            self.position, self._started, self._taken = taken, None, None


def _by_window(pieces: list[tuple[order.Window, int, int]]) -> list[tuple[order.Window, list]]:
    """Consecutive pieces of one window together, so that each window is read once."""
    grouped: list[tuple[order.Window, list]] = []
    for window, lo, hi in pieces:
        if grouped and grouped[-1][0].index == window.index:
            grouped[-1][1].append((lo, hi))
        else:
            grouped.append((window, [(lo, hi)]))
    return grouped


def prefetched(
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
