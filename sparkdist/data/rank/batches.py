"""From decoded chunks to batches of exactly ``batch_size`` rows, the thread ahead, and the
count of what is handed out.

The reader decodes chunks of about 8 MiB (2 MiB shuffled; `sparkdist.data.rank.epochs`) in a
background thread, ``prefetch`` chunks ahead (`prefetched`); batches are cut from them in the
consumer's thread (`rebatch`), as views, so the threads meet once per chunk, not per batch.
Each batch handed out moves the position and counts as a step (`counted`) in the same
loop, so that a batch crosses no other sparkdist module on its way.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from sparkdist.data.rank.decode import EPOCH_END, Chunk
from sparkdist.data.rank.order import Position
from sparkdist.protocol import rank_trace
from sparkdist.protocol.driver_channel import Steps


def _rows(chunk: Chunk) -> int:
    return len(next(iter(chunk.values()))) if chunk else 0


def _cut(chunk: Chunk, start: int, stop: int) -> Chunk:
    return {name: values[start:stop] for name, values in chunk.items()}


def _joined(parts: list[Any]) -> Any:
    """One column's parts end to end: numpy arrays, tensors or lists (strings)."""
    first = parts[0]
    if isinstance(first, np.ndarray):
        return np.concatenate(parts)
    if isinstance(first, list):
        return [value for part in parts for value in part]
    import torch  # a tensor's column: torch is imported already

    return torch.cat(parts)


def _join(parts: list[Chunk]) -> Chunk:
    return {name: _joined([part[name] for part in parts]) for name in parts[0]}


def _pieces(values: Any, start: int, count: int, size: int) -> Any:
    """``count`` pieces of ``size`` rows of one column from row ``start``, as views made
    in one call: a numpy array's rows of a reshape, a tensor's ``unsafe_split`` (views
    of its memory that autograd does not track as views: a third cheaper to make, and
    no batch is a view of another); a list (strings) is sliced a piece at a time."""
    stop = start + count * size
    if isinstance(values, np.ndarray):
        return list(values[start:stop].reshape(count, size, *values.shape[1:]))
    if isinstance(values, list):
        return [values[at : at + size] for at in range(start, stop, size)]
    return values[start:stop].unsafe_split(size)


def _whole_batches(chunk: Chunk, start: int, count: int, size: int) -> list[Chunk]:
    """``count`` batches of ``size`` rows from row ``start`` of ``chunk``: each column cut
    once into all its pieces, and each batch a ``dict(zip(...))`` of one piece of every
    column, so the Python work per batch does not grow with the columns (66 columns cut
    one slice at a time cost 12 us a numpy batch, 50 us a torch batch)."""
    names = list(chunk)
    columns = [_pieces(values, start, count, size) for values in chunk.values()]
    return [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]


def rebatch(chunks: Iterator[Chunk], size: int) -> Iterator[Chunk]:
    """Cut a stream of chunks into batches of exactly ``size`` rows (`rebatch_runs`)."""
    return itertools.chain.from_iterable(rebatch_runs(chunks, size))


def rebatch_runs(chunks: Iterator[Chunk], size: int) -> Iterator[list[Chunk]]:
    """Cut a stream of chunks into batches of exactly ``size`` rows, handed on as lists:
    the batches each chunk completes.

    A chunk's columns are numpy arrays, tensors or lists. Batches inside one chunk are
    views (`_whole_batches`); only a batch that spans two chunks is copied (joined). The
    last batch before an `EPOCH_END` (and at the end of the stream) can be shorter:
    batches never span two epochs.
    """

    def whole(parts: list[Chunk]) -> Chunk:  # one part is a view, several a copy
        return parts[0] if len(parts) == 1 else _join(parts)

    pending: list[Chunk] = []
    count = 0
    for chunk in chunks:
        if chunk is EPOCH_END:
            if pending:
                yield [whole(pending)]
            pending, count = [], 0
            continue
        rows, start, run = _rows(chunk), 0, []
        if count:
            start = min(size - count, rows)
            pending.append(_cut(chunk, 0, start))
            count += start
            if count < size:
                continue
            run.append(whole(pending))
            pending, count = [], 0
        full = (rows - start) // size
        if full:
            run += _whole_batches(chunk, start, full, size)
            start += full * size
        if start < rows:
            pending, count = [_cut(chunk, start, rows)], rows - start
        if run:
            yield run
    if pending:
        yield [whole(pending)]


def as_is(batch: Any) -> Any:
    """A ``collate_fn`` for batches `rebatch` cut from chunks already converted."""
    return batch


def counted(
    batches: Iterator[Any],
    position: Position,
    num_epochs: int | None,
    steps: Steps,
    in_epoch: int,
) -> Iterator[Any]:
    """Pass ``batches`` on, moving ``position`` one batch at a time through ``num_epochs``
    epochs (None: forever; the first has ``in_epoch`` batches). Each is a step of
    ``steps``: a sign of life, and the step rate stragglers are named by (sent at most
    once a second, see `Steps`)."""
    epochs = 0

    def next_epoch() -> bool:
        nonlocal epochs
        position.next_epoch()
        epochs += 1
        return num_epochs is None or epochs < num_epochs

    go_on = True
    while go_on and in_epoch == 0:
        go_on = next_epoch()
        in_epoch = position.batches_in_epoch()
    waited = rank_trace.data_wait
    batches = iter(batches)
    while True:
        asked = time.monotonic()
        batch = next(batches, _DONE)
        if batch is _DONE:
            return
        got = time.monotonic()
        waited(asked, got)  # the training loop's time blocked on the loader
        position.batches += 1  # counted when handed out: state_dict() in the loop sees it
        steps.count += 1
        if steps.due <= got:
            steps.tell()
        while go_on and position.batches >= in_epoch:
            go_on = next_epoch()
            in_epoch = position.batches_in_epoch()
        yield batch


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_DONE = object()


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
