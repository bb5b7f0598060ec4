"""Data, sharded and model parallelism as people write them for torchrun, on 2 CPU ranks
through the runner: Hugging Face Accelerate's `Accelerator()`, FSDP2's `fully_shard`
(compared with DDP on the same data) and a `torch.distributed.rpc` pipeline with a
`RemoteModule` stage, distributed autograd and `DistributedOptimizer`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sparkdist import HorovodRunner

pytest.importorskip("accelerate")

SCRIPTS = Path(__file__).parents[1] / "scripts"
STEPS = 6
LR = 0.1


def _batches(rank: int, steps: int):
    """Each rank's own data: `steps` batches of 8 rows, different on every rank."""
    import torch

    generator = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x = torch.randn(8, 4, generator=generator)
        yield x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 1.0


def _initial_model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Linear(4, 1)


def accelerate_main(steps: int) -> dict:
    """Plain Accelerate code: Accelerator(), prepare, accelerator.backward."""
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    model = _initial_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    model, optimizer = accelerator.prepare(model, optimizer)
    for x, y in _batches(accelerator.process_index, steps):
        optimizer.zero_grad()
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
    weights = [p.detach().flatten().tolist() for p in accelerator.unwrap_model(model).parameters()]
    return {
        "process_index": accelerator.process_index,
        "num_processes": accelerator.num_processes,
        "local_process_index": accelerator.local_process_index,
        "is_main_process": accelerator.is_main_process,
        "distributed_type": str(accelerator.distributed_type),
        "device": accelerator.device.type,
        "weights": weights,
    }


def one_process_weights(ranks: int, steps: int) -> list[list[float]]:
    """The same steps in one process on every rank's batch at once: what averaging the
    ranks' gradients (equal batch sizes) must give."""
    import torch

    model = _initial_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for batches in zip(*(_batches(r, steps) for r in range(ranks)), strict=True):
        x = torch.cat([b[0] for b in batches])
        y = torch.cat([b[1] for b in batches])
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return [p.detach().flatten().tolist() for p in model.parameters()]


@pytest.mark.parametrize("launcher", ["direct", "mpi"])
def test_accelerate_synchronises_gradients(sc, launcher):
    views = HorovodRunner(np=2, launcher=launcher, timeout=180).run_all(
        accelerate_main, steps=STEPS
    )
    assert [v["process_index"] for v in views] == [0, 1]
    assert [v["num_processes"] for v in views] == [2, 2]
    assert [v["is_main_process"] for v in views] == [True, False]
    assert {v["local_process_index"] for v in views} == {0}  # one rank per Spark task
    assert {v["distributed_type"] for v in views} == {"DistributedType.MULTI_CPU"}
    assert {v["device"] for v in views} == {"cpu"}
    # Different data on each rank, yet one model: the gradients were averaged.
    assert views[0]["weights"] == views[1]["weights"]
    expected = one_process_weights(2, STEPS)
    for got, want in zip(views[0]["weights"], expected, strict=True):
        assert got == pytest.approx(want, abs=1e-5)
    assert expected != [p.detach().flatten().tolist() for p in _initial_model().parameters()]


def _fsdp_model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 2),
    )


def _fsdp_data(rank: int):
    import torch

    generator = torch.Generator().manual_seed(200 + rank)
    x = torch.randn(16, 8, generator=generator)
    return x, torch.stack([x[:, :4].sum(dim=1), x[:, 4:].prod(dim=1)], dim=1)


def _train(model, rank: int, steps: int) -> list[float]:
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = _fsdp_data(rank)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    return losses


def fsdp_main(steps: int) -> dict:
    """FSDP2 (`fully_shard` per layer and at the root) and DDP from the same initial
    weights on the same per-rank data, in one job."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))

    ddp = torch.nn.parallel.DistributedDataParallel(_fsdp_model())
    ddp_losses = _train(ddp, rank, steps)

    model = _fsdp_model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    shards = {
        name: {
            "local": list(p.to_local().shape),
            "full": list(p.shape),
            "dtensor": isinstance(p, DTensor),
        }
        for name, p in model.named_parameters()
    }
    fsdp_losses = _train(model, rank, steps)
    full = {name: p.full_tensor() for name, p in model.named_parameters()}
    reference = dict(ddp.module.named_parameters())
    dist.destroy_process_group()
    return {
        "shards": shards,
        "ddp_losses": ddp_losses,
        "fsdp_losses": fsdp_losses,
        "max_diff": max(float((full[n] - reference[n]).abs().max()) for n in full),
        "changed": max(
            float((reference[n] - p).abs().max()) for n, p in _fsdp_model().named_parameters()
        ),
    }


def test_fsdp2_shards_parameters_and_matches_ddp(sc):
    views = HorovodRunner(np=2, launcher="direct", timeout=180).run_all(fsdp_main, steps=STEPS)
    for view in views:
        for name, shard in view["shards"].items():
            assert shard["dtensor"], name
            # Sharded on dim 0: each of the two ranks holds half of every parameter.
            assert shard["local"] == [shard["full"][0] // 2, *shard["full"][1:]], name
        # The gathered FSDP model is the DDP model, trained on the same data.
        assert view["max_diff"] < 1e-5, view["max_diff"]
        assert view["changed"] > 1e-2  # and training moved it
        assert view["fsdp_losses"] == pytest.approx(view["ddp_losses"], abs=1e-5)
    assert views[0]["ddp_losses"] != views[1]["ddp_losses"]  # each rank its own data
    assert views[0]["ddp_losses"][-1] < views[0]["ddp_losses"][0]


@pytest.fixture(scope="module")
def rpc_pipeline():
    import cloudpickle

    sys.path.insert(0, str(SCRIPTS))
    try:
        import rpc_pipeline
    finally:
        sys.path.remove(str(SCRIPTS))
    cloudpickle.register_pickle_by_value(rpc_pipeline)
    yield rpc_pipeline
    cloudpickle.unregister_pickle_by_value(rpc_pipeline)


@pytest.mark.parametrize("launcher", ["direct", "mpi"])
def test_rpc_pipeline_with_remote_module(sc, rpc_pipeline, launcher):
    views = HorovodRunner(np=2, launcher=launcher, timeout=180).run_all(
        rpc_pipeline.pipeline, steps=30
    )
    first = views[0]
    assert first["owners"] == ["worker1"]  # stage 2 lives on rank 1
    losses = first["losses"]
    assert losses[-1] < losses[0] / 2, losses
    # Distributed autograd and DistributedOptimizer did what one process would.
    assert losses == pytest.approx(first["reference_losses"], abs=1e-5)
    assert first["max_weight_diff"] < 1e-5
    for view in views:
        assert view["tp_socket_ifname"] == view["gloo_socket_ifname"] == "lo"
        assert view["gloo_sum"] == 2.0  # the process group shares rank 0's store with RPC
        assert set(view["peers"]) <= {"127.0.0.1", "::ffff:127.0.0.1"}, view["peers"]
