"""Batches already on the device: each packed into a page-locked buffer of a ring, copied
in one piece on a side stream `depth` batches ahead of use, and handed out as views of the
copy, so that the copy overlaps the step.

Why: a loop that moves each batch with `.to("cuda")` waits for every copy, and a copy
from pageable memory cannot overlap anything; pinning each batch (`pin_memory()`) costs a
page-locked allocation and a host copy a tensor, and a copy a tensor is many small
copies. Here a batch's CPU tensors are packed side by side (`batch_pack`) into one slot of
a ring of page-locked byte buffers allocated once, copied to the device in one contiguous
copy on a side stream, and come back as views of the copied bytes. Before batch k+1 is
handed out, the compute stream waits for its copy (on the GPU, not the host).

Nothing handed out is ever overwritten: the device bytes of a batch are a fresh block of
torch's caching allocator (cached, so not a `cudaMalloc` a batch), marked as used by the
compute stream (`record_stream`), so the allocator reuses it only once every view of it is
gone and the compute stream has passed its last use, autograd's saved inputs included.
A ring slot's page-locked bytes, which no user sees, are packed again only after the copy
out of them has finished (the host waits for that copy's event).

The torch loader moves whole chunks instead (`sparkdist.data.rank.device_feed`, which
uses these sides' streams and events); it packs batch by batch here only where the batches
are made elsewhere (DataLoader workers, ``pin_memory``, a ``collate_fn``).

On a CPU device `HostSide` runs the same packing into a ring of plain buffers and hands out
views of a fresh copy: the order of batches, what is moved and what is not, and the
depth are what a CPU test sees.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch

from sparkdist.data.rank import batch_pack


class Ring:
    """`slots` host byte buffers, reused in turn: a slot is packed again only after the
    copy out of it finished. A slot grows (a new buffer) when a batch needs more bytes."""

    def __init__(self, side: Any, slots: int) -> None:
        self.side = side
        self.buffers: list[Any] = [None] * slots
        self.copies: list[Any] = [None] * slots
        self.turn = 0

    def take(self, nbytes: int) -> tuple[int, Any]:
        """The next slot, free to pack, with at least `nbytes`: (its index, its bytes)."""
        index = self.turn
        self.turn = (self.turn + 1) % len(self.buffers)
        if self.copies[index] is not None:
            self.side.wait_for_copy(self.copies[index])  # its last copy still reads it
            self.copies[index] = None
        buffer = self.buffers[index]
        if buffer is None or buffer.numel() < nbytes:
            grown = max(nbytes, 2 * buffer.numel() if buffer is not None else 0)
            buffer = self.buffers[index] = self.side.host_bytes(grown)
        return index, buffer

    def copying(self, index: int, copy: Any) -> None:
        """Slot `index` is being copied out until `copy` (an event) completes."""
        self.copies[index] = copy


class Pending:
    """A batch on its way to the device: its copy's bytes, their event and its layout."""

    def __init__(self, batch: Any, packed: Any, done: Any, leaves: list) -> None:
        self.batch, self.packed, self.done, self.leaves = batch, packed, done, leaves


class PackedSide:
    """What the CUDA and the CPU sides share: pack a batch into a ring slot and start
    its copy (`start`); hand it out as views of the copy (`finish`)."""

    ring: Ring

    def start(self, batch: Any) -> Pending:
        tensors = batch_pack.tensors_of(batch)
        if not tensors:  # nothing to move
            return Pending(batch, None, None, [])
        leaves, nbytes = batch_pack.layout(tensors)
        nbytes = max(nbytes, batch_pack.ALIGN)  # empty tensors still get device views
        index, host = self.ring.take(nbytes)
        batch_pack.pack(tensors, leaves, host)
        packed, done = self.copy_out(host[:nbytes])
        self.ring.copying(index, done)
        return Pending(batch, packed, done, leaves)

    def finish(self, pending: Pending) -> Any:
        """The batch, safe to use on the compute stream."""
        if pending.packed is None:
            return pending.batch
        self.ready(pending.packed, pending.done)
        return batch_pack.rebuild(pending.batch, pending.packed, pending.leaves)


class CudaSide(PackedSide):
    """Page-locked slots, one copy a batch on a side stream of `device`, an event each."""

    moves = True  # a copy to another device

    def __init__(self, device: Any, slots: int) -> None:
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device)
        self.ring = Ring(self, slots)

    def host_bytes(self, nbytes: int) -> Any:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def copy_out(self, host: Any) -> tuple[Any, Any]:
        """Queue `host`'s copy to fresh device bytes on the side stream: (them, its event)."""
        with torch.cuda.stream(self.stream):
            packed = torch.empty(host.numel(), dtype=torch.uint8, device=self.device)
            packed.copy_(host, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        return packed, done

    def wait_for_copy(self, done: Any) -> None:
        done.synchronize()

    def copy_done(self, done: Any) -> bool:
        return done.query()

    def ready(self, packed: Any, done: Any) -> None:
        """The compute stream waits for the copy, and holds the bytes while it reads them."""
        current = torch.cuda.current_stream(self.device)
        current.wait_event(done)
        packed.record_stream(current)

    def joining(self) -> Any:
        """Work on the copied bytes (slicing, joining) queued behind the copies."""
        return torch.cuda.stream(self.stream)

    def mark(self) -> Any:
        """An event once everything queued so far on the side stream is done."""
        done = torch.cuda.Event()
        done.record(self.stream)
        return done

    def plain(self, values: np.ndarray) -> Any:
        """``values`` copied as a plain ``.to(device)`` does (pageable, waited for)."""
        with torch.cuda.stream(self.stream):
            return torch.from_numpy(values).to(self.device)

    def settle(self) -> None:
        """Wait for everything queued on the side stream (to time it)."""
        self.stream.synchronize()


class HostSide(PackedSide):
    """The same steps on a CPU device: plain slots, the copy made at once."""

    moves = False

    def __init__(self, device: Any, slots: int) -> None:
        self.device = torch.device(device)
        self.ring = Ring(self, slots)

    def host_bytes(self, nbytes: int) -> Any:
        return torch.empty(nbytes, dtype=torch.uint8)

    def copy_out(self, host: Any) -> tuple[Any, None]:
        return host.clone(), None

    def wait_for_copy(self, done: Any) -> None:
        """Nothing to wait for: the copy was made at once."""

    def copy_done(self, done: Any) -> bool:
        return True

    def ready(self, packed: Any, done: Any) -> None:
        """Nothing to wait for: the copy was made at once."""

    def joining(self) -> Any:
        return contextlib.nullcontext()

    def mark(self) -> None:
        """Nothing queued: every copy was made at once."""

    def plain(self, values: np.ndarray) -> Any:
        """``values`` as a CPU tensor: the plain path moves nothing."""
        return torch.from_numpy(values)

    def settle(self) -> None:
        """Nothing queued."""


def side_for(device: Any, slots: int) -> CudaSide | HostSide:
    kind = torch.device(device).type
    if kind == "cuda":
        return CudaSide(device, slots)
    if kind == "cpu":
        return HostSide(device, slots)
    raise ValueError(f"device={device!r}: batches can be prefetched to cuda or cpu")


class DevicePrefetcher:
    """Iterates `batches` on `device`, each copied `depth` (>= 1) batches ahead of use.

    ```python
    for batch in DevicePrefetcher(loader, "cuda"):  # or make_torch_dataloader(device=...)
        loss = model(batch["x"])  # already on the GPU; the next batch is on its way
    ```
    """

    def __init__(self, batches: Iterable[Any], device: Any, depth: int = 1) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be an int >= 1 (batches copied ahead), got {depth!r}")
        self.batches, self.depth = batches, depth
        # depth copies in flight and one being packed: the host seldom waits for a slot.
        self.side = side_for(device, slots=depth + 2)

    def __iter__(self) -> Iterator[Any]:
        source = iter(self.batches)
        ahead: deque = deque()
        for batch in source:  # the first `depth` batches on their way
            ahead.append(self.side.start(batch))
            if len(ahead) == self.depth:
                break
        while ahead:
            pending = ahead.popleft()
            following = next(source, _END)
            if following is not _END:  # queued before this one is handed out: overlapped
                ahead.append(self.side.start(following))
            yield self.side.finish(pending)

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]


_END = object()
