"""`sparkdist.data.rank.device_prefetch`: batches copied to the device a batch (or `depth`)
ahead of use. On CPU the same iteration runs with `HostSide`; a recording side shows the
copy of batch k+1 starts before batch k is handed out, and is finished before its own
turn. With a GPU, the batches come out on it, equal to the CPU's."""

from __future__ import annotations

import pytest
import torch

from sparkdist.data.rank.device_prefetch import DevicePrefetcher, HostSide, map_tensors


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
