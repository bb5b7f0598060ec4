"""A reader's decoded chunks of one iteration, epoch after epoch, with their marks.

Each epoch follows its plan (`order.EpochPlans`: which windows, which rows of them): read
in the files' order by `decode.WindowDecoder`, shuffled by `sparkdist.data.rank.shuffled`;
each epoch ends with `decode.EPOCH_END`, and its chunks carry the pad and weight columns
asked for (`Marks`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from sparkdist.data.rank import order
from sparkdist.data.rank.decode import EPOCH_END, Chunk, WindowDecoder
from sparkdist.data.rank.decode_processes import DecodeProcesses
from sparkdist.data.rank.piece_memory import PieceMemory
from sparkdist.data.rank.shuffled import shuffled_chunks


def _rows(chunk: Chunk) -> int:
    return len(next(iter(chunk.values()))) if chunk else 0


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
    memory: PieceMemory,
    marks: Marks,
    convert: Callable[[Chunk], Chunk] | None = None,
) -> Iterator[Chunk]:
    """A reader's decoded chunks of one iteration (``plans``: `order.EpochPlans`), each
    epoch closed by `EPOCH_END`; the decoder's threads (or its decode processes, started
    once an iteration) share each window's work, and ``convert`` (e.g. to petastorm's
    types) is applied to each chunk once it is marked."""
    processes = DecodeProcesses(decoder.threads) if decoder.processes else None
    try:
        for plan in plans:
            chunks = _epoch_chunks(decoder, plan, memory, processes)
            if marks.weights:
                chunks = mark_weights(chunks, marks.weights, plan)
            if marks.pads:
                chunks = mark_pads(chunks, marks.pads, plan.real)
            yield from chunks if convert is None else map(convert, chunks)
            yield EPOCH_END
    finally:
        if processes is not None:
            processes.close()


def _epoch_chunks(
    decoder: WindowDecoder,
    plan: order.EpochPlan,
    memory: PieceMemory,
    processes: DecodeProcesses | None = None,
) -> Iterator[Chunk]:
    """One epoch's chunks, a window after another. Shuffled, the decoder's threads share
    each window's work (its column groups, its pieces), so the memory in flight does not
    grow with them (`shuffled.shuffled_chunks`); read in order, each thread streams a
    group of the columns (`sparkdist.data.rank.column_streams`). With decode
    ``processes``, a window in order is decoded as a shuffled one is, in the files' order."""
    if processes is not None:
        yield from shuffled_chunks(decoder, plan, memory, processes)
        return
    shared = decoder.threads > 1
    pool = ThreadPoolExecutor(decoder.threads, "sparkdist-data-decode") if shared else None
    try:
        if plan.order.shuffle:
            yield from shuffled_chunks(decoder, plan, memory, pool)
        else:
            yield from decoder.read(plan.pieces, pool)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


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
