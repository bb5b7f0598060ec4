"""From decoded chunks to batches of exactly ``batch_size`` rows, and the thread ahead.

The reader decodes chunks of about 8 MiB (2 MiB shuffled; `sparkdist.data.rank.decode`) in a
background thread, ``prefetch`` chunks ahead (`prefetched`); batches are cut from them in the
consumer's thread (`rebatch`), as views, so the threads meet once per chunk, not per batch.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from sparkdist.data.rank.decode import Chunk

# Ends an epoch in a stream of chunks: the batch in progress ends there, short if need be.
EPOCH_END: Chunk = {}


def _rows(chunk: Chunk) -> int:
    return len(next(iter(chunk.values()))) if chunk else 0


def _cut(chunk: Chunk, start: int, stop: int) -> Chunk:
    return {name: values[start:stop] for name, values in chunk.items()}


def _join(parts: list[Chunk]) -> Chunk:
    if len(parts) == 1:
        return parts[0]
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


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


def mark_weights(chunks: Iterator[Chunk], column: str, plan: Any) -> Iterator[Chunk]:
    """The chunks of one epoch with ``column``: each row's weight in its step's mean.

    ``plan`` (a `reader.EpochPlan`): the first ``plan.full`` rows are in full steps, the
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


def rebatch(chunks: Iterator[Chunk], size: int) -> Iterator[Chunk]:
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
