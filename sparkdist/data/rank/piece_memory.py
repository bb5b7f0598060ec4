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
"""

from __future__ import annotations

import collections

import numpy as np

from sparkdist.data.rank import chunk_ring


class _Exposed:
    """``raw`` bytes as numpy sees them: arrays made from it refer to this object, so
    ``__del__`` runs once no array is left, and gives ``raw`` back to ``free``."""

    def __init__(self, raw: np.ndarray, free: collections.deque) -> None:
        self.raw, self.free = raw, free
        self.__array_interface__ = raw.__array_interface__

    def __del__(self) -> None:
        self.free.append(self.raw)  # deque.append: safe from any thread


class PieceMemory:
    """Slabs for a reader's pieces, kept for the next ones once nothing refers to them;
    at most ``keep`` free slabs are kept (the rest go back to the system)."""

    def __init__(self, keep: int = 48) -> None:
        self.keep = keep
        self.size = 0  # of a slab: the most bytes a piece asked for, so any slab fits most
        self.free: collections.deque[np.ndarray] = collections.deque()

    def carver(self, nbytes: int) -> chunk_ring.Carver:
        """A carver over a slab of at least ``nbytes`` that no array refers to."""
        self.size = max(self.size, nbytes)
        while len(self.free) > self.keep:
            self.free.popleft()
        raw = None
        while raw is None and self.free:
            try:
                raw = self.free.popleft()
            except IndexError:  # taken meanwhile (a DataLoader worker's own memory)
                break
            if len(raw) < nbytes:  # from before a larger piece: let it go
                raw = None
        if raw is None:
            raw = np.empty(self.size, np.uint8)
        return chunk_ring.Carver(np.asarray(_Exposed(raw, self.free))[:nbytes])

    def __getstate__(self) -> dict:
        return {"keep": self.keep}  # a copy (a DataLoader worker's) has its own slabs

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["keep"])
