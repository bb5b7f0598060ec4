"""`sparkdist.data.rank.device_prefetch`: batches copied to the device a batch (or `depth`)
ahead of use. On CPU the same iteration runs with `HostSide`; a recording side shows the
copy of batch k+1 starts before batch k is handed out, and is finished before its own
turn. `CudaSide` itself runs on CPU against stand-in streams and events (what a GPU would
be): each batch is copied on the side stream, the compute stream waits for that copy's
event before the batch is handed out, and every tensor of it is marked as used by the
compute stream. With a GPU, the batches come out on it, equal to the CPU's."""

from __future__ import annotations

import contextlib

import pytest
import torch

from sparkdist.data.rank.device_prefetch import (
    CudaSide,
    DevicePrefetcher,
    HostSide,
    map_tensors,
)


class RecordingSide(HostSide):
    """`HostSide` that logs each start and finish, to see the order of copies."""

    def __init__(self) -> None:
        super().__init__("cpu")
        self.log: list[tuple[str, int]] = []

    def start(self, batch):
        self.log.append(("start", int(batch["id"][0])))
        return super().start(batch)

    def finish(self, moved, done):
        self.log.append(("finish", int(moved["id"][0])))
        return super().finish(moved, done)


def _batches(n: int) -> list[dict]:
    return [{"id": torch.full((4,), k), "name": [f"row {k}"] * 4} for k in range(n)]


@pytest.mark.parametrize("depth", [1, 2])
def test_each_batch_is_copied_depth_batches_ahead_of_use(depth):
    prefetcher = DevicePrefetcher(_batches(4), "cpu", depth=depth)
    side = prefetcher.side = RecordingSide()
    handed = []
    for batch in prefetcher:
        handed.append(int(batch["id"][0]))
        started = [k for kind, k in side.log if kind == "start"]
        assert started == list(range(min(4, handed[-1] + 1 + depth)))  # depth ahead
    assert handed == [0, 1, 2, 3] and len(prefetcher) == 4
    assert [k for kind, k in side.log if kind == "finish"] == [0, 1, 2, 3]


def test_only_tensors_move_and_bad_settings_are_refused():
    batch = {"x": torch.ones(2), "pair": (torch.zeros(1), 3), "name": ["a", "b"]}
    seen = []
    out = map_tensors(batch, lambda t: seen.append(t) or t + 1)
    assert len(seen) == 2 and out["name"] == ["a", "b"] and out["pair"][1] == 3
    assert torch.equal(out["x"], torch.full((2,), 2.0))
    with pytest.raises(ValueError, match="depth"):
        DevicePrefetcher([], "cpu", depth=0)
    with pytest.raises(ValueError, match="cuda or cpu"):
        DevicePrefetcher([], "meta")
    assert list(DevicePrefetcher([], "cpu")) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_batches_arrive_on_the_gpu_equal_to_the_cpu_ones():
    batches = _batches(5)
    got = list(DevicePrefetcher(batches, "cuda", depth=2))
    assert all(b["id"].device.type == "cuda" for b in got)
    assert [b["id"].cpu().tolist() for b in got] == [b["id"].tolist() for b in batches]


class StandInStream:
    """A CUDA stream, as far as `CudaSide` uses one: what was queued on it, in order."""

    def __init__(self, name: str) -> None:
        self.name, self.ops = name, []

    def wait_event(self, event) -> None:
        self.ops.append(("wait", event))


class StandInEvent:
    """A CUDA event: the stream it was recorded on, and where in that stream's queue."""

    stream, position = None, None

    def record(self, stream) -> None:
        self.stream, self.position = stream, len(stream.ops)
        stream.ops.append(("record", self))


class StandInGpu:
    """torch.cuda's streams and events for `CudaSide`, and the stream now selected
    (`torch.cuda.stream(side)` selects the side stream for the copies)."""

    def __init__(self) -> None:
        self.compute = StandInStream("compute")
        self.selected = [self.compute]

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: StandInStream("side"))
        monkeypatch.setattr(torch.cuda, "Event", StandInEvent)
        monkeypatch.setattr(torch.cuda, "stream", self.stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: self.selected[-1])

    @contextlib.contextmanager
    def stream(self, stream):
        self.selected.append(stream)
        try:
            yield
        finally:
            self.selected.pop()


class HostTensor(torch.Tensor):
    """A pageable host tensor of a batch: pinning it and copying it to the device are
    recorded (the copy on the stream selected then); the copy is a `DeviceTensor`."""

    gpu: StandInGpu

    def is_pinned(self, device=None) -> bool:
        return getattr(self, "pinned", False)

    def pin_memory(self, device=None):
        pinned = torch.Tensor.clone(self.as_subclass(torch.Tensor)).as_subclass(HostTensor)
        pinned.pinned = True
        return pinned

    def to(self, device, non_blocking=False):
        assert self.is_pinned() and non_blocking, "a copy that can overlap: pinned, async"
        stream = HostTensor.gpu.selected[-1]
        moved = torch.Tensor.clone(self.as_subclass(torch.Tensor)).as_subclass(DeviceTensor)
        moved.copied_on, moved.copy_at, moved.used_on = stream, len(stream.ops), []
        stream.ops.append(("copy", moved))
        return moved


class DeviceTensor(torch.Tensor):
    """A tensor on the stand-in device: where it was copied, and the streams marked as
    using it (`record_stream`)."""

    def record_stream(self, stream) -> None:
        self.used_on.append(stream)


@pytest.mark.parametrize("depth", [1, 2])
def test_a_batch_is_handed_out_after_the_compute_stream_waits_for_its_copy(monkeypatch, depth):
    gpu = StandInGpu()
    gpu.install(monkeypatch)
    HostTensor.gpu = gpu
    batches = [
        {
            "id": torch.full((4,), k).as_subclass(HostTensor),
            "x": torch.ones(2, 3).as_subclass(HostTensor),
            "name": ["a"],
        }
        for k in range(4)
    ]
    prefetcher = DevicePrefetcher(batches, "cuda", depth=depth)
    assert isinstance(prefetcher.side, CudaSide)
    side = prefetcher.side.stream
    handed = []
    for batch in prefetcher:
        handed.append(int(batch["id"][0]))
        tensors = [batch["id"], batch["x"]]
        assert all(t.copied_on is side for t in tensors)  # copied on the side stream
        # The compute stream waits (on the device) for an event recorded on the side
        # stream after this batch's copies: the step cannot read them half done.
        waited = [op[1] for op in gpu.compute.ops if op[0] == "wait"]
        assert any(
            e.stream is side and all(e.position > t.copy_at for t in tensors) for e in waited
        ), f"batch {handed[-1]} handed out before the compute stream waited for its copy"
        # Its memory is marked as used by the compute stream: not reused under the step.
        assert all(t.used_on == [gpu.compute] for t in tensors), (
            f"batch {handed[-1]}'s tensors are not marked as used by the compute stream"
        )
        assert batch["name"] == ["a"]
    assert handed == [0, 1, 2, 3]
    assert [op[0] for op in gpu.compute.ops] == ["wait"] * 4  # no copy on the compute stream
