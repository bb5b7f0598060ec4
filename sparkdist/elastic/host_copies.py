"""Commit copies of CUDA tensors: into pinned host buffers, on a side stream, overlapped
with the next step.

Why: a commit every step that copied a GPU model to host memory synchronously would stall
each step for the whole transfer (tens of milliseconds per GB over PCIe). A commit here
first copies the tensors within the device, into staging buffers kept across commits (on
the compute stream, so the copy sees the step's values and the next step cannot change
them under it; about a millisecond per GB). A side stream then copies the staging buffers
into pinned host buffers, also kept across commits, while the next step runs, and records
an event. Whatever reads the commit (a restore, a sync, the next commit, which overwrites
the buffers) waits for that event first (`DeviceCommits.wait`).

The staging buffers cost one more copy of the committed tensors in device memory. When the
device has not that much free, the side stream copies straight from the live tensors and
the commit waits for it: synchronous, still into pinned memory.

CPU tensors never come here (`broadcast.snapshot` copies them as it always did). The copies
run through a side: `CudaSide` on a GPU; `DeferredSide`, a stand-in for CPU tests, runs a
commit's host copies only when the commit is waited for, so a reader that forgot to wait
reads the buffers' old contents and the test sees it.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

STAGING_SHARE = 0.5
"""Staging buffers are made only while they take at most this share of the free device
memory."""


class CudaSide:
    """A side CUDA stream of one device, its pinned host buffers and its events."""

    def __init__(self, device: Any) -> None:
        import torch

        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device)

    def host_buffer(self, like: Any) -> Any:
        import torch

        return torch.empty(like.shape, dtype=like.dtype, pin_memory=True)

    def can_stage(self, nbytes: int) -> bool:
        import torch

        free, _ = torch.cuda.mem_get_info(self.device)
        return nbytes <= free * STAGING_SHARE

    def copy(self, hosts: list, sources: list) -> Any:
        """Queue `host.copy_(source)` for each pair on the side stream, after the work the
        compute stream has queued so far; the event that says they are done."""
        import torch

        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            for host, source in zip(hosts, sources, strict=True):
                host.copy_(source, non_blocking=True)
        done = torch.cuda.Event()
        done.record(self.stream)
        return done


class _Deferred:
    """`DeferredSide`'s event: the copies run at the first `synchronize()`."""

    def __init__(self, hosts: list, sources: list) -> None:
        self._pairs: list | None = list(zip(hosts, sources, strict=True))

    def query(self) -> bool:
        return self._pairs is None

    def synchronize(self) -> None:
        if self._pairs is not None:
            for host, source in self._pairs:
                host.copy_(source)
            self._pairs = None


class DeferredSide:
    """A stand-in for `CudaSide` in CPU tests: every tensor is taken as if on a device,
    and a commit's host copies run only when it is waited for (the farthest a real side
    stream can lag behind)."""

    def __init__(self, can_stage: bool = True) -> None:
        import torch

        self.device = torch.device("cpu")
        self._can_stage = can_stage

    def host_buffer(self, like: Any) -> Any:
        import torch

        return torch.empty(like.shape, dtype=like.dtype)

    def can_stage(self, nbytes: int) -> bool:
        return self._can_stage

    def copy(self, hosts: list, sources: list) -> _Deferred:
        return _Deferred(hosts, sources)


class DeviceCommits:
    """One value's commit copies of device tensors, and the buffers kept across commits.

    A commit is `begin()` (wait for the last one), `add(tensor, host)` for each device
    tensor (returns the host tensor the commit holds), `launch()`. `wait()` before
    reading what the commit holds. `side`: a stand-in that takes every tensor (tests)."""

    def __init__(self, side: Any = None) -> None:
        self._fixed_side = side
        self._sides: dict = {}
        self._sources: list = []
        self._hosts: list = []
        self._staging: list = []
        self._pending: list = []
        self.devices: list = []
        """Where each tensor leaf of the last commit came from (None: it was on the CPU)."""

    def takes(self, tensor: Any) -> bool:
        return self._fixed_side is not None or tensor.device.type == "cuda"

    def begin(self) -> None:
        self.wait()
        self._sources, self._hosts, self.devices = [], [], []

    def add(self, tensor: Any, host: Any | None) -> Any:
        """Commit `tensor` (a device tensor) into `host` (the last commit's host tensor of
        the same dtype and shape) or a new host buffer; returns the host tensor."""
        if host is None:
            host = self._side(tensor.device).host_buffer(tensor)
        self._sources.append(tensor.detach())
        self._hosts.append(host)
        self.devices.append(tensor.device)
        return host

    def host_buffer(self, like: Any, numel: int) -> Any:
        """A flat host buffer of `numel` elements of `like`'s dtype, for `like`'s device
        (pinned for a GPU); `add` fills views of it."""
        import torch

        return self._side(like.device).host_buffer(
            torch.empty(numel, dtype=like.dtype, device="meta")
        )

    def skip(self) -> None:
        """A tensor leaf of the tree that stays on the CPU (keeps `devices` in step)."""
        self.devices.append(None)

    def launch(self) -> None:
        """Start the host copies of every tensor added since `begin()`."""
        by_device: dict = {}
        for index, source in enumerate(self._sources):
            by_device.setdefault(source.device, []).append(index)
        for device, indexes in by_device.items():
            side = self._side(device)
            sources = [self._sources[i] for i in indexes]
            hosts = [self._hosts[i] for i in indexes]
            staged = self._stage(side, sources)
            done = side.copy(hosts, staged if staged is not None else sources)
            if staged is None:  # copied from the live tensors: they may change next step
                done.synchronize()
            else:
                self._pending.append(done)
        self._sources = []

    def wait(self) -> None:
        """Block until the last commit's host copies are complete."""
        pending, self._pending = self._pending, []
        for done in pending:
            done.synchronize()

    def ready(self) -> bool:
        """Are the last commit's host copies complete (without waiting)?"""
        return all(done.query() for done in self._pending)

    def _side(self, device: Any) -> Any:
        if self._fixed_side is not None:
            return self._fixed_side
        if device not in self._sides:
            self._sides[device] = CudaSide(device)
        return self._sides[device]

    def _stage(self, side: Any, sources: list) -> list | None:
        """Copy `sources` into this device's staging buffers (reused when the layout is
        the last commit's); None when the device has no room for them."""
        layout = [(s.dtype, tuple(s.shape), s.device) for s in sources]
        kept = [s for s in self._staging if s.device == sources[0].device]
        if [(s.dtype, tuple(s.shape), s.device) for s in kept] != layout:
            self._staging = [s for s in self._staging if s.device != sources[0].device]
            kept = []
            if not side.can_stage(sum(s.numel() * s.element_size() for s in sources)):
                logger.info(
                    "elastic: no device memory to stage the commit: it is copied "
                    "to the host synchronously"
                )
                return None
            kept = [s.new_empty(s.shape) for s in sources]
            self._staging.extend(kept)
        for staging, source in zip(kept, sources, strict=True):
            staging.copy_(source)
        return kept


def to_devices(tree: Any, devices: list) -> Any:
    """A fresh copy of `tree` (a commit) with each tensor leaf back on the device it was
    committed from (`devices`, in leaf order), copied with `non_blocking` from its pinned
    host buffer; CPU leaves cloned."""
    import torch

    from sparkdist.elastic.broadcast import map_leaves

    where = iter(devices)

    def back(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        device = next(where)
        if device is None:
            return value.clone()
        return value.to(device, non_blocking=True, copy=True)

    return map_leaves(tree, back)


def to_live_devices(tree: Any, live: Any) -> Any:
    """`tree` (a state received in host memory) with each tensor copied, `non_blocking`,
    to the device of the same tensor of `live` (the value's own state_dict), when both
    hold the same tensors; else `tree` as it is (its loader moves it)."""
    import torch

    from sparkdist.elastic.broadcast import map_leaves

    found: list = []
    map_leaves(live, lambda v: found.append(v) if isinstance(v, torch.Tensor) else None)
    mine: list = []
    map_leaves(tree, lambda v: mine.append(v) if isinstance(v, torch.Tensor) else None)
    layout = [(t.dtype, tuple(t.shape)) for t in mine]
    if layout != [(t.dtype, tuple(t.shape)) for t in found]:
        return tree
    devices = [t.device if t.device.type != "cpu" else None for t in found]
    if all(device is None for device in devices):
        return tree
    return to_devices(tree, devices)
