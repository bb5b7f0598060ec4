"""Host slots that a chunk of rows is assembled in, reused as a ring once copied out.

Why: a chunk gathered into fresh memory, cut into batches and then packed batch by batch
into a page-locked buffer is copied twice on the host. Here the decode threads gather a
chunk's rows (several batches, all columns) straight into a slot of page-locked bytes
(`Slot.carve`: numpy arrays in the slot), so the only copy after it is the one to the
device, of the whole chunk at once (`sparkdist.data.rank.device_feed`).

A slot is taken for one chunk and given back once the copy out of it has finished
(`SlotRing.sent`: the host asks the copy's event, and waits for it only when no slot is
free and the ring is at its size): nothing still being copied is written again. Slots
are allocated once and kept; the ring grows past its size rather than wait for a slot
that no copy will free (one still being filled).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

import numpy as np

from sparkdist.data.rank import row_block

logger = logging.getLogger(__name__)

ALIGN = 256  # each array starts at a multiple: aligned for any dtype and vector loads


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def room_for(sizes: Iterable[int]) -> int:
    """Bytes a slot needs for arrays of these ``sizes`` carved one after the other."""
    return sum(aligned(nbytes) for nbytes in sizes)


class Carver:
    """Numpy arrays cut one after the other from ``host`` bytes, each aligned."""

    def __init__(self, host: np.ndarray, handle: Any = None) -> None:
        self.host = host
        self.used = 0
        self.handle = handle  # a shared slab's (`shared_slabs.Handle`), None if private

    @property
    def room(self) -> int:
        return len(self.host) - aligned(self.used)

    def carve(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised array of ``shape`` in the next free bytes."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        start = aligned(self.used)
        if start + nbytes > len(self.host):
            raise ValueError(f"{nbytes} bytes asked of a slot with {self.room} left")
        self.used = start + nbytes
        return self.host[start : start + nbytes].view(dtype).reshape(shape)


def fresh_carver(nbytes: int) -> Carver:
    """A carver of memory never reused (`row_block.fresh`): what the plain path hands out."""
    return Carver(row_block.fresh((nbytes,), np.dtype(np.uint8)))


class Slot(Carver):
    """A ring slot: ``buffer`` (host bytes, a torch tensor) and its numpy view."""

    def __init__(self, buffer: Any) -> None:
        super().__init__(buffer.numpy())
        self.buffer = buffer
        self.address = self.host.ctypes.data
        self.copy: Any = None  # the copy out of it still to finish (its event)
        self.copy_order = 0  # when that copy was queued, to wait for the oldest first
        self.taken = False

    def offset_of(self, values: np.ndarray) -> int | None:
        """Where ``values`` starts in the slot, if it lies in it whole and contiguous."""
        start = values.__array_interface__["data"][0] - self.address
        inside = 0 <= start and start + values.nbytes <= len(self.host)
        return start if inside and values.flags.c_contiguous else None


class SlotRing:
    """Page-locked (the `side`'s `host_bytes`) slots, ``size`` of them as a rule, shared by
    the decode threads that fill them and the thread that copies them out."""

    def __init__(self, side: Any, size: int) -> None:
        self.side, self.size = side, size
        self.slots: list[Slot] = []
        self.lock = threading.Lock()
        self.copies = 0

    def take(self, nbytes: int) -> Slot:
        """A slot of at least ``nbytes`` that nothing reads or writes: a free one, else a
        new one while the ring is below its size, else the one whose copy went out first
        (once that copy has finished), else a new one."""
        with self.lock:
            slot = self._free(nbytes) or self._oldest_sent()
            if slot is None or (slot.copy is not None and len(self.slots) < self.size):
                if slot is not None:
                    slot.taken = False
                slot = self._new(nbytes)
        if slot.copy is not None:
            self.side.wait_for_copy(slot.copy)  # outside the lock: others go on
            slot.copy = None
        if len(slot.host) < nbytes:
            self._grow(slot, nbytes)
        slot.used = 0
        return slot

    def _free(self, nbytes: int) -> Slot | None:
        fits = None
        for slot in self.slots:
            if slot.taken or (slot.copy is not None and not self.side.copy_done(slot.copy)):
                continue
            slot.copy = None
            if fits is None or (len(fits.host) < nbytes <= len(slot.host)):
                fits = slot
        if fits is not None:
            fits.taken = True
        return fits

    def _oldest_sent(self) -> Slot | None:
        sent = [slot for slot in self.slots if not slot.taken and slot.copy is not None]
        if not sent:
            return None
        oldest = min(sent, key=lambda slot: slot.copy_order)
        oldest.taken = True
        return oldest

    def _new(self, nbytes: int) -> Slot:
        slot = Slot(self.side.host_bytes(aligned(nbytes)))
        slot.taken = True
        self.slots.append(slot)
        if len(self.slots) > self.size:
            logger.debug("sparkdist.data: chunk ring grown to %d slots", len(self.slots))
        return slot

    def _grow(self, slot: Slot, nbytes: int) -> None:
        buffer = self.side.host_bytes(aligned(max(nbytes, 2 * len(slot.host))))
        Slot.__init__(slot, buffer)
        slot.taken = True

    def owner(self, values: np.ndarray) -> Slot | None:
        """The taken slot that ``values`` lies in, if any."""
        with self.lock:
            for slot in self.slots:
                if slot.taken and slot.offset_of(values) is not None:
                    return slot
        return None

    def sent(self, slot: Slot, copy: Any) -> None:
        """``slot``'s bytes are being copied out until ``copy`` finishes; then it is free."""
        with self.lock:
            self.copies += 1
            slot.copy, slot.copy_order, slot.taken = copy, self.copies, False

    def drop(self, slot: Slot) -> None:
        """``slot`` is free again, nothing copied out of it."""
        with self.lock:
            slot.taken = False
