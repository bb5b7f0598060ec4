"""`sparkdist.data.rank.device_prefetch` and `batch_pack`: batches packed into a ring of
host buffers and copied to the device in one piece, a batch (or `depth`) ahead of use.

On CPU the same iteration runs with `HostSide`: a recording side shows the copy of batch
k+1 starts before batch k is handed out; every dtype and shape comes back equal, as views
of one copy. The ring's safety runs against a stand-in of `CudaSide` whose copies run as
late as a GPU may run them (only when waited for): a slot packed again before its copy ran
would hand out the wrong rows. With a GPU, the batches come out on it, equal to the CPU's.
"""

from __future__ import annotations

import pytest
import torch
from helpers import LateCopy

from sparkdist.data.rank import batch_pack
from sparkdist.data.rank.device_prefetch import CudaSide, DevicePrefetcher, HostSide, Ring


class RecordingSide(HostSide):
    """`HostSide` that logs each start and finish, to see the order of copies."""

    def __init__(self, slots: int) -> None:
        super().__init__("cpu", slots)
        self.log: list[tuple[str, int]] = []

    def start(self, batch):
        self.log.append(("start", int(batch["id"][0])))
        return super().start(batch)

    def finish(self, pending):
        moved = super().finish(pending)
        self.log.append(("finish", int(moved["id"][0])))
        return moved


def _batches(n: int) -> list[dict]:
    return [{"id": torch.full((4,), k), "name": [f"row {k}"] * 4} for k in range(n)]


@pytest.mark.parametrize("depth", [1, 2])
def test_each_batch_is_copied_depth_batches_ahead_of_use(depth):
    prefetcher = DevicePrefetcher(_batches(4), "cpu", depth=depth)
    side = prefetcher.side = RecordingSide(depth + 2)
    handed = []
    for batch in prefetcher:
        handed.append(int(batch["id"][0]))
        started = [k for kind, k in side.log if kind == "start"]
        assert started == list(range(min(4, handed[-1] + 1 + depth)))  # depth ahead
    assert handed == [0, 1, 2, 3] and len(prefetcher) == 4
    assert [k for kind, k in side.log if kind == "finish"] == [0, 1, 2, 3]


def _mixed_batch(k: int) -> dict:
    """Every kind of leaf a batch holds: dtypes with and without a numpy twin, a
    non-contiguous tensor, an empty one, a 0-d one, strings, a tuple, a number."""
    return {
        "x": torch.arange(12, dtype=torch.float32).reshape(3, 4) + k,
        "id": torch.tensor([k, k + 1, k + 2], dtype=torch.int64),
        "mask": torch.tensor([True, False, k % 2 == 0]),
        "half": torch.full((3,), k, dtype=torch.bfloat16),
        "small": torch.full((3, 2), k, dtype=torch.uint8),
        "transposed": torch.arange(6, dtype=torch.int16).reshape(2, 3).t() * k,
        "empty": torch.zeros((0, 5)),
        "scalar": torch.tensor(float(k)),
        "name": [f"row {k}"] * 3,
        "pair": (torch.full((2,), k, dtype=torch.float64), k),
    }


def _assert_same(got, want) -> None:
    assert type(got) is type(want)
    if isinstance(want, torch.Tensor):
        assert (got.dtype, got.shape) == (want.dtype, want.shape)
        assert torch.equal(got.cpu(), want)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for key in want:
            _assert_same(got[key], want[key])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _assert_same(g, w)
    else:
        assert got == want


def test_every_leaf_comes_back_equal_as_views_of_one_copy_and_only_tensors_move():
    batches = [_mixed_batch(k) for k in range(7)]
    got = list(DevicePrefetcher(batches, "cpu", depth=2))  # all held: none overwritten
    for out, want in zip(got, batches, strict=True):
        _assert_same(out, want)
        tensors = batch_pack.tensors_of(out)
        assert len(tensors) == 9  # the tensors, not the strings or the number
        # One copy a batch: every tensor is a view of the same bytes, none of the source's.
        assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1
        assert all(not t.is_contiguous() or t.data_ptr() % 16 == 0 for t in tensors)
        assert not any(
            t.untyped_storage().data_ptr() == s.untyped_storage().data_ptr()
            for t, s in zip(tensors, batch_pack.tensors_of(want), strict=True)
        )
    assert list(DevicePrefetcher([{"name": ["a"]}], "cpu")) == [{"name": ["a"]}]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="depth"):
        DevicePrefetcher([], "cpu", depth=0)
    with pytest.raises(ValueError, match="cuda or cpu"):
        DevicePrefetcher([], "meta")
    assert list(DevicePrefetcher([], "cpu")) == []


class LateCudaSide(CudaSide):
    """`CudaSide`'s ring and packing, with a stand-in device: plain host bytes, and each
    copy a `LateCopy`. Making the compute stream wait for a copy (`ready`) runs nothing on
    the host: the device does it when it gets there."""

    def __init__(self, slots: int) -> None:
        self.device = torch.device("cpu")
        self.ring = Ring(self, slots)
        self.allocated = 0
        self.queued: list[LateCopy] = []
        self.readied: list[LateCopy] = []

    def host_bytes(self, nbytes: int) -> torch.Tensor:
        self.allocated += 1
        return torch.empty(nbytes, dtype=torch.uint8)

    def copy_out(self, host):
        copy = LateCopy(host)
        self.queued.append(copy)
        return copy.device, copy

    def wait_for_copy(self, done: LateCopy) -> None:
        done.run()

    def ready(self, packed, done: LateCopy) -> None:
        self.readied.append(done)

    def catch_up(self) -> None:
        for copy in self.queued:
            copy.run()


@pytest.mark.parametrize("depth", [1, 3])
def test_a_ring_slot_is_packed_again_only_after_its_copy_ran(depth):
    """20 batches through a ring of depth+2 slots, each slot reused many times, on a
    stand-in device that runs behind the host: no copy runs until the host waits for it
    or the device catches up at the end. Every batch (all held to the end) equals its
    source, so no slot was packed again under a copy still to run; the slots were
    allocated once, and each batch was handed out after the compute stream's wait."""
    batches = [_mixed_batch(k) for k in range(20)]
    prefetcher = DevicePrefetcher(batches, "cpu", depth=depth)
    side = prefetcher.side = LateCudaSide(depth + 2)
    got = []
    for batch in prefetcher:
        assert len(side.readied) == len(got) + 1  # the compute stream waits, then it is out
        assert side.readied[-1].device.untyped_storage().data_ptr() == (
            batch["x"].untyped_storage().data_ptr()
        )
        got.append(batch)
    side.catch_up()
    for out, want in zip(got, batches, strict=True):
        _assert_same(out, want)
    assert side.allocated == depth + 2 and len(side.queued) == 20


def test_a_slot_grows_for_a_larger_batch():
    ring = Ring(HostSide("cpu", 2), slots=2)
    _, first = ring.take(100)
    _, second = ring.take(1000)
    _, again = ring.take(50)
    assert again is first and second.numel() == 1000
    _, kept = ring.take(150)
    _, grown = ring.take(300)  # slot 0 again, too small now
    assert kept is second and grown is not first and grown.numel() >= 300


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_batches_arrive_on_the_gpu_equal_to_the_cpu_ones():
    batches = [_mixed_batch(k) for k in range(5)]
    got = list(DevicePrefetcher(batches, "cuda", depth=2))
    assert all(b["x"].device.type == "cuda" for b in got)
    for out, want in zip(got, batches, strict=True):
        _assert_same(out, want)
