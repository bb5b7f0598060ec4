"""What the elastic torch tests share: a small model and its training step (which ranks
run, so this module travels by value), and what the tests read back from the ranks'
event logs (`log-<launch>.jsonl`)."""

from __future__ import annotations

import sys

import cloudpickle
import torch
from pyspark import cloudpickle as pyspark_cloudpickle

COLLECTIVE_FAILED = 3
"""A spawned rank's exit code when its collective failed as a broken world's does."""
START_S = 120


def small_model(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def take_step(model, optimizer, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    loss = model(torch.randn(16, 4, generator=generator)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def flat_parameters(state) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in state.model.parameters()])


def launch_events(out, launch: int) -> list[dict]:
    import json

    path = out / f"log-{launch}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def assert_grew_from_two_to_four(entries: dict[int, list[dict]], last_before: int) -> None:
    """Launch ranks 0 and 1 went on in their processes as ranks 0 and 1 of 4, and 2 and 3
    joined generation 1 as ranks 2 and 3, all from the step world 0 last took."""
    for launch in (0, 1):
        first, again = entries[launch]
        assert (first["generation"], again["generation"]) == (0, 1)
        assert again["pid"] == first["pid"] and (again["rank"], again["size"]) == (launch, 4)
    for launch in (2, 3):
        (joined,) = entries[launch]
        assert (joined["generation"], joined["rank"], joined["size"]) == (1, launch, 4)
    assert {e["step"] for r in range(4) for e in entries[r][-1:]} == {last_before}  # none redone


def world_change(out, launches) -> tuple[dict[int, list[dict]], int]:
    """Each rank's entries into `train`, and the last step world 0 took (on any rank)."""
    events = {launch: launch_events(out, launch) for launch in launches}
    entries = {
        launch: [e for e in found if e["event"] == "enter"] for launch, found in events.items()
    }
    steps = [
        e["step"]
        for found in events.values()
        for e in found
        if e["event"] == "stepped" and e["generation"] == 0
    ]
    return entries, max(steps)


def enter_world(state, generation: int, members: tuple, launch: int, port: int) -> None:
    """Form world `generation` (its members' launch ranks, in order) and sync the state
    into it, as `elastic.run` does on each entry."""
    import datetime

    import torch.distributed as dist

    from sparkdist.elastic.generations import Generation
    from sparkdist.elastic.torch_group import TorchGroup

    if dist.is_initialized():
        dist.destroy_process_group()
    rank = members.index(launch)
    store = dist.TCPStore(
        "127.0.0.1", port, len(members), is_master=rank == 0, timeout=datetime.timedelta(seconds=60)
    )
    dist.init_process_group("gloo", store=store, rank=rank, world_size=len(members))
    state._group = TorchGroup(Generation(generation, members), rank, "gloo", store)
    state.sync()


for _pickler in (cloudpickle, pyspark_cloudpickle):
    _pickler.register_pickle_by_value(sys.modules[__name__])
