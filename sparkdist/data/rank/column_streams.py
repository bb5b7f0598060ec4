"""An in-order read's row groups decoded on several threads: a group of columns a thread.

Read in the files' order, a rank streams each row group a chunk at a time. With more
than one decode thread (``workers_count``), each thread streams its own group of the
columns through its own reader of the file (`ColumnStreams`), row group after row group
and a chunk ahead, and the reading thread joins the groups' batches of a chunk into
one record batch. Arrow's own pool would decode a chunk's columns side by side too, but
it has OMP_NUM_THREADS threads: one under torchrun, and in Spark's Python workers.

The threads run ahead on their own rather than a task a chunk: a task waits for the GIL
to start, which the reading thread holds while it cuts the last chunk into batches, so a
task a chunk decoded little more than one thread did (1.0-1.16x, 64 columns).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa

from sparkdist.data import fs

# Chunks a thread holds decoded ahead of the reading thread, besides the one it decodes
# (each its group's share of ~8 MiB).
AHEAD = 1

_END = object()  # a row group's last batch came before it


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def column_groups(sizes: dict[str, float], count: int) -> list[list[str]]:
    """The columns (name: bytes, in order) in at most ``count`` groups of consecutive
    columns of about a ``count``-th of the bytes each (a column a group at most: as
    many groups as columns where ``count`` is more). A shuffled window's column groups
    are cut the same way (`sparkdist.data.rank.shuffled.column_groups`)."""
    share = sum(sizes.values()) / max(count, 1)
    groups: list[list[str]] = [[]]
    done = 0.0
    for name, size in sizes.items():
        if groups[-1] and done + size / 2 > len(groups) * share:  # past its group's share
            groups.append([])
        groups[-1].append(name)
        done += size
    return groups


class ColumnStreams:
    """``row_groups`` ((file URL, row group, rows wanted from its start), in order) read
    ``rows`` at a time: a thread of ``pool`` a group of columns (``groups``), each
    `AHEAD` chunk ahead. `row_groups` hands each row group's record batches in turn;
    `close` stops the threads (a ``with`` block closes them)."""

    def __init__(
        self,
        row_groups: Sequence[tuple[str, int, int]],
        rows: int,
        groups: list[list[str]],
        pool: ThreadPoolExecutor,
    ) -> None:
        self._count = len(row_groups)
        self._names = [name for group in groups for name in group]
        self._stop = threading.Event()
        self._queues: list[queue.Queue] = [queue.Queue(AHEAD) for _ in groups]
        self._threads: list[Future] = [
            pool.submit(self._stream, row_groups, rows, names, out)
            for names, out in zip(groups, self._queues, strict=True)
        ]

    def __enter__(self) -> ColumnStreams:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def row_groups(self) -> Iterator[Iterator[pa.RecordBatch]]:
        """Each row group's batches, in order. A row group's iterator must be read to its
        end before the next one's (`drained`)."""
        for _ in range(self._count):
            yield self._batches()

    def close(self) -> None:
        """Stop the threads and wait for them: each ends within the chunk it decodes."""
        self._stop.set()
        for thread in self._threads:
            thread.result()

    def _batches(self) -> Iterator[pa.RecordBatch]:
        while True:
            parts = [self._take(out) for out in self._queues]
            if parts[0] is _END:
                return
            columns = [column for part in parts for column in part.columns]
            yield pa.RecordBatch.from_arrays(columns, names=self._names)

    def _take(self, out: queue.Queue) -> object:
        item = out.get()
        if isinstance(item, _Failure):
            raise item.error
        return item

    def _stream(
        self,
        row_groups: Sequence[tuple[str, int, int]],
        rows: int,
        names: list[str],
        out: queue.Queue,
    ) -> None:
        """A thread's work: its columns of every row group, a chunk at a time, up to each
        one's wanted rows, then `_END`; an error is handed on to the reading thread."""
        try:
            footers: dict[str, object] = {}
            for url, row_group, wanted in row_groups:
                parquet = fs.open_parquet(url, footers.get(url))
                footers.setdefault(url, parquet.metadata)
                read = 0
                for batch in parquet.iter_batches(
                    rows, row_groups=[row_group], columns=names, use_threads=False
                ):
                    if not self._put(out, batch):
                        return
                    read += batch.num_rows
                    if read >= wanted:
                        break
                if not self._put(out, _END):
                    return
        except BaseException as error:  # raised in the reading thread
            self._put(out, _Failure(error))

    def _put(self, out: queue.Queue, item: object) -> bool:
        while not self._stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False


def drained(batches: Iterator[object]) -> None:
    """Read a row group's batches to its end (those past its wanted rows' chunk: none)."""
    for _ in batches:
        pass
