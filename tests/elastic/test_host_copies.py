"""Commits of CUDA tensors (`sparkdist.elastic.host_copies`): the logic on CPU, through
`DeferredSide`, a stand-in for the side stream that runs a commit's host copies only when
the commit is waited for. A reader that did not wait would read the buffers' old
contents; a step that changed the live tensors before the copies ran would change the
commit. The same checks run with a real CUDA side stream where there is a GPU."""

from __future__ import annotations

import pytest
import torch

from sparkdist import elastic
from sparkdist.elastic import host_copies, shard_copies

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")


def _model(device: str = "cpu") -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    model = model.to(device)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def _step(model, optimizer, seed: int) -> None:
    device = next(model.parameters()).device
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(seed)).to(device)
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).cpu() for t in tensors])


def _deferred_state(**side) -> elastic.TorchState:
    model, optimizer = _model()
    state = elastic.TorchState(model=model, optimizer=optimizer, step=0)
    state._copies = {
        name: host_copies.DeviceCommits(host_copies.DeferredSide(**side))
        for name in ("model", "optimizer")
    }
    return state


def test_a_commit_is_read_only_after_its_copies_and_a_step_after_it_does_not_change_it():
    state = _deferred_state()
    _step(state.model, state.optimizer, 1)
    state.commit()
    committed = _flat(state.model.parameters()).clone()
    saved = state._saved["model"]
    assert not state._copies["model"].ready()  # the side stream has not run yet
    _step(state.model, state.optimizer, 2)  # the next step, overlapping the copies
    state.wait_commit()
    assert torch.equal(_flat(saved.values()), committed)  # staged before the step changed them
    state.step = 9
    state.restore()
    assert torch.equal(_flat(state.model.parameters()), committed) and state.step == 0
    assert state._copies["model"].devices == [torch.device("cpu")] * 4


def test_restore_and_the_next_commit_wait_for_the_copies_and_reuse_the_buffers():
    state = _deferred_state()
    _step(state.model, state.optimizer, 1)
    state.commit()
    committed = _flat(state.model.parameters()).clone()
    moments = state.optimizer.state_dict()["state"][0]["exp_avg"].clone()
    _step(state.model, state.optimizer, 2)
    state.restore()  # waits for the deferred copies, or it would load the old buffers
    assert torch.equal(_flat(state.model.parameters()), committed)
    assert torch.equal(state.optimizer.state_dict()["state"][0]["exp_avg"], moments)
    hosts = [t.data_ptr() for t in state._saved["model"].values()]
    staging = [t.data_ptr() for t in state._copies["model"]._staging]
    _step(state.model, state.optimizer, 3)
    state.commit()  # waits for the last commit, then overwrites its buffers
    assert [t.data_ptr() for t in state._saved["model"].values()] == hosts
    assert [t.data_ptr() for t in state._copies["model"]._staging] == staging
    after = _flat(state.model.parameters()).clone()
    state.restore()
    assert torch.equal(_flat(state.model.parameters()), after)


def test_without_room_to_stage_a_commit_copies_synchronously():
    state = _deferred_state(can_stage=False)
    _step(state.model, state.optimizer, 1)
    state.commit()
    assert state._copies["model"].ready() and state._copies["model"]._staging == []
    committed = _flat(state.model.parameters()).clone()
    _step(state.model, state.optimizer, 2)
    assert torch.equal(_flat(state._saved["model"].values()), committed)


def test_cpu_tensors_keep_the_plain_copy():
    model, optimizer = _model()
    state = elastic.TorchState(model=model, optimizer=optimizer)
    _step(model, optimizer, 1)
    state.commit()
    copies = state._copies["model"]
    assert copies.devices == [None] * 4 and copies._staging == [] and copies.ready()
    tree = {"w": torch.ones(2)}
    assert host_copies.to_live_devices(tree, {"w": torch.zeros(2)}) is tree


def test_shard_pieces_are_copied_on_the_side_and_waited_for():
    copies = host_copies.DeviceCommits(host_copies.DeferredSide())
    parts = {
        torch.float32: [torch.ones(3), torch.full((2,), 2.0)],
        torch.int64: [torch.ones(2).long()],
    }
    buffers = shard_copies._copy_on_side(parts, copies, None)
    piece = shard_copies.Piece(shard_copies.Mark(0, 1, 1), 0, [], buffers, copies)
    assert not copies.ready()
    parts[torch.float32][0].add_(5)  # the next step: the staged copy keeps the commit
    piece.wait()
    assert buffers[torch.float32].tolist() == [1, 1, 1, 2, 2]
    assert buffers[torch.int64].tolist() == [1, 1]
    again = shard_copies._copy_on_side(parts, copies, buffers)  # reused: the same memory
    assert again[torch.float32].data_ptr() == buffers[torch.float32].data_ptr()
    copies.wait()
    assert buffers[torch.float32].tolist() == [6, 6, 6, 2, 2]


def test_held_pieces_offer_the_oldest_own_buffers_for_reuse():
    held = shard_copies.Held()
    assert held.recyclable(0) is None
    for commit in (1, 2):
        mark = shard_copies.Mark(0, 2, commit)
        held.keep(shard_copies.Piece(mark, 0, [], {torch.float32: torch.zeros(commit)}))
        held.keep(shard_copies.Piece(mark, 1, [], {torch.float32: torch.ones(commit)}))
    assert held.recyclable(0)[torch.float32].tolist() == [0.0]  # commit 1's, dropped next


class LoggedSide(host_copies.DeferredSide):
    """`DeferredSide` whose copies say, in `log`, when they ran (at the first wait)."""

    def __init__(self, log: list) -> None:
        super().__init__()
        self.log = log

    def copy(self, hosts, sources):
        done = super().copy(hosts, sources)
        run = done.synchronize

        def synchronize() -> None:
            if not done.query():
                self.log.append("copies ran")
            run()

        done.synchronize = synchronize
        return done


def test_a_commit_returns_before_its_copies_run_and_a_restore_waits_for_them():
    """The second commit's host copies run only once something waits for them: the commit
    returns first (the next step overlaps them), and the restore runs them before it
    loads, or it would load the first commit's buffers."""
    log: list = []
    model, optimizer = _model()
    state = elastic.TorchState(model=model, optimizer=optimizer, step=0)
    state._copies = {name: host_copies.DeviceCommits(LoggedSide(log)) for name in ("model",)}
    _step(model, optimizer, 1)
    state.commit()  # the buffers now hold the first commit, once its copies ran
    _step(model, optimizer, 2)
    log.clear()
    state.commit()  # waits for the first commit's copies, then starts its own
    log.append("commit returned")
    committed = _flat(model.parameters()).clone()
    _step(model, optimizer, 3)  # overlapping the copies
    log.append("restore")
    state.restore()
    assert log == ["copies ran", "commit returned", "restore", "copies ran"]
    assert torch.equal(_flat(model.parameters()), committed)


@CUDA
def test_cuda_commit_overlaps_and_restores_on_the_device():
    """A commit's host copies queue behind the work the compute stream has queued (here a
    kernel of about a second): the commit returns while they wait, and the restore waits
    for them."""
    import time

    model, optimizer = _model("cuda")
    state = elastic.TorchState(model=model, optimizer=optimizer, step=0)
    _step(model, optimizer, 1)
    state.commit()  # the first: its pinned buffers are made (allocations may synchronise)
    assert all(t.is_pinned() for t in state._saved["model"].values())
    _step(model, optimizer, 2)
    committed = _flat(model.parameters()).clone()
    torch.cuda._sleep(2_000_000_000)  # about a second of GPU clock cycles, queued
    started = time.monotonic()
    state.commit()
    returned_s = time.monotonic() - started
    assert not state._copies["model"].ready()  # its copies wait behind the kernel
    assert returned_s < 0.5, returned_s  # the commit did not wait for them
    _step(model, optimizer, 3)
    state.restore()
    assert state._copies["model"].ready()
    assert torch.equal(_flat(model.parameters()), committed)
    assert all(p.device.type == "cuda" for p in model.parameters())
    exp_avg = optimizer.state_dict()["state"][0]["exp_avg"]
    assert exp_avg.device.type == "cuda"
