"""From decoded chunks to batches of exactly ``batch_size`` rows, and the thread ahead.

The reader decodes chunks of about 8 MiB (2 MiB shuffled; `sparkdist.data.rank.decode`) in a
background thread, ``prefetch`` chunks ahead (`prefetched`); batches are cut from them in the
consumer's thread (`rebatch`), as views, so the threads meet once per chunk, not per batch.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from sparkdist.data.rank.decode import Chunk
from sparkdist.data.rank.order import Position
from sparkdist.protocol.driver_channel import Steps

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


def rebatch(
    chunks: Iterator[Chunk], size: int, convert: Callable[[Chunk], Any] | None = None
) -> Iterator[Any]:
    """Cut a stream of numpy chunks into batches of exactly ``size`` rows.

    Batches inside one chunk are views; only a batch that spans two chunks is copied.
    The last batch before an `EPOCH_END` (and at the end of the stream) can be shorter:
    batches never span two epochs. ``convert`` (e.g. to tensors) is applied to each chunk
    once, and to each batch joined from two chunks, before the batches are cut from it:
    its values must slice as numpy arrays do.
    """
    pending: list[Chunk] = []
    count = 0
    for chunk in chunks:
        if chunk is EPOCH_END:
            if pending:
                yield _joined(pending, convert)
            pending, count = [], 0
            continue
        rows, start = _rows(chunk), 0
        if count:
            start = min(size - count, rows)
            pending.append(_cut(chunk, 0, start))
            count += start
            if count < size:
                continue
            yield _joined(pending, convert)
            pending, count = [], 0
        whole = chunk if convert is None or rows - start < size else convert(chunk)
        while rows - start >= size:
            yield {name: values[start : start + size] for name, values in whole.items()}
            start += size
        if start < rows:
            pending, count = [_cut(chunk, start, rows)], rows - start
    if pending:
        yield _joined(pending, convert)


def _joined(parts: list[Chunk], convert: Callable[[Chunk], Any] | None) -> Any:
    return _join(parts) if convert is None else convert(_join(parts))


def as_is(batch: Any) -> Any:
    """A ``collate_fn`` for batches made whole by `rebatch` (converted, if need be)."""
    return batch


def counted(
    batches: Iterator[Any], position: Position, num_epochs: int | None, steps: Steps
) -> Iterator[Any]:
    """Pass ``batches`` on, moving ``position`` one batch at a time (``num_epochs`` from
    it; None: forever), each a step of ``steps``: a sign of life, and the step rate
    stragglers are named by (sent at most once a second, see `Steps`)."""
    epochs = 0

    def next_epoch() -> bool:
        nonlocal epochs
        position.next_epoch()
        epochs += 1
        return num_epochs is None or epochs < num_epochs

    go_on = True
    while go_on and position.batches_in_epoch() == 0:
        go_on = next_epoch()
    in_epoch = position.batches_in_epoch()
    for batch in batches:
        position.batches += 1  # counted when handed out: state_dict() in the loop sees it
        steps.count += 1
        if steps.due <= time.monotonic():
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
