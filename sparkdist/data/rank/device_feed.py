"""Chunks on the device: each copied whole from a ring slot, its batches sliced there.

Why: a batch packed and copied on its own is a host copy and a small transfer a batch.
Here a chunk (several batches' rows, every column) is assembled in a slot of page-locked
bytes (`sparkdist.data.rank.chunk_ring`: a shuffled read's decode threads gather into it;
columns made elsewhere, such as Arrow's in-order buffers, the pad and weight marks or a
transform's output, are packed into the slot's tail), copied to the device in one copy
on the side stream, and cut into batches there (`batches.rebatch_runs` on the device
tensors: views; a batch across two chunks is joined on the device, queued behind both
copies). Strings stay host lists.

Nothing handed out is overwritten: a slot is filled again only after its copy finished
(`SlotRing`), and each batch's device bytes are held for the compute stream
(`record_stream`) when it is handed out (`hand_out`), after the compute stream waits for
everything queued on the side stream for it.

Where the ring cannot win, the feed falls back by itself (``mode="auto"``): on the first
chunks of an iteration it times both ways on the same chunk, the ring (assembled in the
slot, one copy, waited for) and a plain ``.to(device)`` of each column (waited for), and
keeps the faster (`Choice`, logged at INFO). ``mode`` (or env `MODE_ENV`) forces one.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sparkdist import job_environment
from sparkdist.data.rank import chunk_ring
from sparkdist.data.rank.batches import rebatch_runs
from sparkdist.data.rank.decode import EPOCH_END, Chunk

logger = logging.getLogger(__name__)

MODE_ENV = job_environment.DEVICE_FEED
MODES = ("auto", "ring", "plain")
TRIAL_CHUNKS = 3  # chunks timed both ways (after a first one that warms both up)


def feed_mode(mode: str | None) -> str:
    """``mode``, else env `MODE_ENV`, else "auto"; checked."""
    chosen = mode or os.environ.get(MODE_ENV) or "auto"
    if chosen not in MODES:
        raise ValueError(f"device feed {chosen!r}: one of {MODES} (or env {MODE_ENV})")
    return chosen


@dataclass
class Choice:
    """Ring or plain: forced, or (``auto``) the faster on the trial chunks."""

    mode: str
    ring: list[float] = field(default_factory=list)
    plain: list[float] = field(default_factory=list)

    @property
    def trying(self) -> bool:
        return self.mode == "auto"

    def timed(self, ring: float, plain: float) -> None:
        """One trial chunk's seconds each way; after `TRIAL_CHUNKS`, the faster is kept."""
        self.ring.append(ring)
        self.plain.append(plain)
        if len(self.ring) < TRIAL_CHUNKS:
            return
        ring_s, plain_s = sum(self.ring), sum(self.plain)
        self.mode = "plain" if plain_s < ring_s else "ring"
        logger.info(
            "sparkdist.data: device feed: the ring took %.2f ms a chunk, a plain .to() "
            "%.2f ms (%d chunks each): keeping %s",
            1e3 * ring_s / len(self.ring),
            1e3 * plain_s / len(self.plain),
            len(self.ring),
            "the ring" if self.mode == "ring" else "plain .to()",
        )


@dataclass(frozen=True)
class Ready:
    """What a run of batches needs before the compute stream reads it: ``event`` (all
    queued for it on the side stream) and the device ``blocks`` it is sliced from."""

    event: Any
    blocks: tuple


@dataclass(frozen=True)
class Handed:
    batch: Any
    ready: Ready


class ChunkFeed:
    """One iteration's chunks to the device through a `chunk_ring.SlotRing` (``side``:
    `device_prefetch`'s `CudaSide` or `HostSide`), batches handed out there.

    ``slots``: the ring's size; ``choice``: ring or plain (a loader's, kept across its
    iterations); ``extra_row_bytes``: bytes a row that columns made after the gather take
    (marks, widened types), kept free in each slot's tail.
    """

    def __init__(
        self,
        side: Any,
        slots: int,
        choice: Choice | None = None,
        extra_row_bytes: int = 0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.side, self.clock = side, clock
        self.ring = chunk_ring.SlotRing(side, slots)
        self.choice = choice or Choice(feed_mode(None))  # shared: kept from one iteration on
        self.extra_row_bytes = extra_row_bytes
        self.chunks = 0

    def memory(self, nbytes: int, rows: int) -> chunk_ring.Carver:
        """Where a decode thread assembles a chunk of ``rows`` rows (``nbytes``): a ring slot
        with room for the columns added later, or (plain) memory never reused."""
        if self.choice.mode == "plain":
            return chunk_ring.fresh_carver(nbytes)
        tail = rows * self.extra_row_bytes + 8 * chunk_ring.ALIGN
        return self.ring.take(nbytes + tail)

    def to_device(self, chunk: Chunk) -> tuple[Chunk, tuple]:
        """``chunk`` on the device (strings as lists), and the device blocks it is views of."""
        self.chunks += 1
        if not self.choice.trying or self.chunks == 1:
            plain = self.choice.mode == "plain"
            return self._plain(chunk) if plain else self._ring(chunk)
        began = self.clock()
        self._plain(chunk, release=False)  # the ring's copy still reads the slot
        self.side.settle()
        between = self.clock()
        moved = self._ring(chunk)
        self.side.settle()
        self.choice.timed(self.clock() - between, between - began)
        return moved

    def _ring(self, chunk: Chunk) -> tuple[Chunk, tuple]:
        """The chunk's numbers in one slot, copied out in one piece: those gathered there
        stay, the others are packed into its tail (or, without room, all into a new slot)."""
        numbers = {name: values for name, values in chunk.items() if values.dtype != object}
        if not numbers:
            return _lists(chunk), ()
        gathered = self._owner(numbers)
        slot, places = gathered, {}
        if gathered is not None:
            places = {name: gathered.offset_of(values) for name, values in numbers.items()}
            places = {name: at for name, at in places.items() if at is not None}
        outside = [name for name in numbers if name not in places]
        if slot is None or slot.room < _bytes(numbers, outside):
            slot, places, outside = self.ring.take(_bytes(numbers, numbers)), {}, list(numbers)
        for name in outside:
            values = numbers[name]
            piece = slot.carve(values.shape, values.dtype)
            np.copyto(piece, values, casting="no")
            places[name] = slot.offset_of(piece)
        if gathered is not None and gathered is not slot:
            self.ring.drop(gathered)  # its columns were packed anew
        packed, done = self.side.copy_out(slot.buffer[: slot.used])
        self.ring.sent(slot, done)
        out = _lists(chunk)
        for name, values in numbers.items():
            out[name] = _view(packed, places[name], values)
        return {name: out[name] for name in chunk}, (packed,)

    def _plain(self, chunk: Chunk, release: bool = True) -> tuple[Chunk, tuple]:
        """Each column copied on its own as ``.to(device)`` copies it (on a CPU device, a
        tensor of its memory, or of a copy where a slot holds it); its slot then free."""
        numbers = {name: values for name, values in chunk.items() if values.dtype != object}
        gathered = self._owner(numbers) if numbers else None
        out = _lists(chunk)
        for name, values in numbers.items():
            own = values.flags.writeable and values.flags.c_contiguous
            if not own or (gathered is not None and not self.side.moves):
                values = np.array(values, order="C")  # torch's own, not the slot's
            out[name] = self.side.plain(values)
        if release and gathered is not None:
            self.ring.drop(gathered)
        return {name: out[name] for name in chunk}, tuple(out[name] for name in numbers)

    def _owner(self, numbers: Chunk) -> chunk_ring.Slot | None:
        for values in numbers.values():
            slot = self.ring.owner(values)
            if slot is not None:
                return slot
        return None

    def runs(self, chunks: Iterator[Chunk], size: int) -> Iterator[list[Handed]]:
        """`rebatch_runs` of the chunks moved to the device, each run with what the compute
        stream waits for and holds before it reads the run's batches."""
        blocks: list = []

        def moved() -> Iterator[Chunk]:
            for chunk in chunks:
                if chunk is EPOCH_END:
                    yield chunk
                    continue
                device_chunk, held = self.to_device(chunk)
                blocks.extend(held)
                yield device_chunk

        runs = rebatch_runs(moved(), size)
        while True:
            with self.side.joining():  # joins queued behind the copies
                run = next(runs, None)
            if run is None:
                return
            ready = Ready(self.side.mark(), tuple(blocks))
            blocks.clear()
            yield [Handed(batch, ready) for batch in run]

    def hand_out(self, items: Iterator[Handed]) -> Iterator[Any]:
        """The batches, each once the compute stream waited for it and holds its bytes: a
        run's blocks once, a batch joined on the device (bytes of its own) tensor by tensor."""
        last, held, own = None, set(), set()
        for item in items:
            ready = item.ready
            if ready is not last:
                for block in ready.blocks:
                    self.side.ready(block, ready.event)
                before, own = own, {block.untyped_storage().data_ptr() for block in ready.blocks}
                held = own | before  # a batch may be of a chunk the run before copied
                last = ready
            if self.side.moves:  # a batch's columns are all views, or all joined
                values = item.batch.values()
                first = next((v for v in values if isinstance(v, torch.Tensor)), None)
                if first is not None and first.untyped_storage().data_ptr() not in held:
                    for tensor in values:
                        if isinstance(tensor, torch.Tensor):
                            self.side.ready(tensor, ready.event)
            yield item.batch


def _lists(chunk: Chunk) -> dict[str, Any]:
    """The chunk's strings (and other objects) as lists, the way torch batches hold them."""
    return {name: values.tolist() for name, values in chunk.items() if values.dtype == object}


def _bytes(numbers: Chunk, names: Any) -> int:
    return chunk_ring.room_for(numbers[name].nbytes for name in names)


@functools.lru_cache(maxsize=64)
def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype)).dtype


def _view(packed: torch.Tensor, offset: int, values: np.ndarray) -> torch.Tensor:
    """The copy of ``values`` at ``offset`` of the device bytes ``packed``: a view."""
    piece = packed[offset : offset + values.nbytes]
    return piece.view(_torch_dtype(values.dtype)).view(values.shape)
