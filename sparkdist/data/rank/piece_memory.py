"""Host memory for a shuffled read's pieces, reused once nothing refers to it.

A shuffled window's rows are put in the epoch's order straight into the pieces that are
handed out (`sparkdist.data.rank.shuffled`), all of a window's pieces at once. Fresh
memory for each would take a page fault every 4 KiB: Arrow's pool and malloc give the
pages of the last window's freed pieces back to the system before the next window asks
for them (0.15-0.25 CPU s an epoch of 2M rows at 64 columns, a fifth of the read). And a
buffer that the reader reuses by itself could not be handed out.

So a piece's memory is a slab that goes back to a free list when the last array that
refers to it is dropped (by the training loop, a torch tensor made from it, or Python's
collector): numpy's views keep the object that exposes the slab alive (`_Exposed`), and
its ``__del__`` returns the bytes. Nothing handed out is written again while anything can
still read it, and a read whose batches are dropped as they are used allocates nothing
after its first windows.

With decode processes (``shared``), the slabs are shared memory they map
(`sparkdist.data.rank.shared_slabs`), and all are kept: a process keeps its mapping of a
slab, so a slab let go would stay mapped there.
"""

from __future__ import annotations

import collections

import numpy as np

from sparkdist.data.rank import chunk_ring, shared_slabs

Slab = tuple[np.ndarray, shared_slabs.Handle | None]  # bytes, and their handle if shared


class _Exposed:
    """A slab's bytes as numpy sees them: arrays made from it refer to this object, so
    ``__del__`` runs once no array is left, and gives the slab back to ``free``."""

    def __init__(self, slab: Slab, free: collections.deque) -> None:
        self.slab, self.free = slab, free
        self.__array_interface__ = slab[0].__array_interface__

    def __del__(self) -> None:
        self.free.append(self.slab)  # deque.append: safe from any thread


class PieceMemory:
    """Slabs for a reader's pieces, kept for the next ones once nothing refers to them;
    at most ``keep`` free slabs are kept (the rest go back to the system), all if ``shared``
    (decode processes map them)."""

    def __init__(self, keep: int = 48, shared: bool = False) -> None:
        self.keep = keep
        self.shared = shared
        self.size = 0  # of a slab: the most bytes a piece asked for, so any slab fits most
        self.free: collections.deque[Slab] = collections.deque()

    def carver(self, nbytes: int) -> chunk_ring.Carver:
        """A carver over a slab of at least ``nbytes`` that no array refers to (its
        ``handle``: where a decode process finds it, if ``shared``)."""
        self.size = max(self.size, nbytes)
        while len(self.free) > self.keep and not self.shared:
            self.free.popleft()
        slab = None
        while slab is None and self.free:
            try:
                slab = self.free.popleft()
            except IndexError:  # taken meanwhile (a DataLoader worker's own memory)
                break
            if len(slab[0]) < nbytes:  # from before a larger piece: let it go
                slab = None
        if slab is None:
            slab = (
                shared_slabs.shared(self.size)
                if self.shared
                else (np.empty(self.size, np.uint8), None)
            )
        return chunk_ring.Carver(np.asarray(_Exposed(slab, self.free))[:nbytes], slab[1])

    def __getstate__(self) -> dict:
        # A copy (a DataLoader worker's) has its own slabs.
        return {"keep": self.keep, "shared": self.shared}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["keep"], state["shared"])
