"""Model parallelism with `torch.distributed.rpc`, as people write it for torchrun: a
pipeline whose first stage lives on rank 0 and whose every further stage is a
`RemoteModule` on the next rank, trained with distributed autograd and
`DistributedOptimizer`. The ranks also join a Gloo process group on the same
MASTER_ADDR/MASTER_PORT (rank 0's TCPStore then serves both). RPC starts and stops
through `sparkdist.torch_rpc`.

Rank 0 returns the losses, where the remote stages live, and the largest difference
between the trained weights and the same model trained in one process; every rank
returns the environment TensorPipe read and the addresses it talked to.
"""

from __future__ import annotations

import os

WIDTH = 16


def _tcp_peers() -> list[str]:
    import psutil

    return sorted({c.raddr.ip for c in psutil.Process().net_connections("tcp") if c.raddr})


def _train(stages, parameters, x, y, steps: int, distributed: bool) -> list[float]:
    """SGD on `stages` applied in order; with distributed autograd if `distributed`."""
    import torch
    import torch.distributed.autograd as dist_autograd
    from torch.distributed.optim import DistributedOptimizer

    if distributed:
        optimizer = DistributedOptimizer(torch.optim.SGD, parameters, lr=0.2)
    else:
        optimizer = torch.optim.SGD(parameters, lr=0.2)
    losses = []
    for _ in range(steps):
        if distributed:
            with dist_autograd.context() as context:
                out = x
                for stage in stages:
                    out = stage(out)
                loss = torch.nn.functional.mse_loss(out, y)
                dist_autograd.backward(context, [loss])
                optimizer.step(context)
        else:
            optimizer.zero_grad()
            out = x
            for stage in stages:
                out = stage(out)
            loss = torch.nn.functional.mse_loss(out, y)
            loss.backward()
            optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def _stages(world_size: int) -> list:
    """One stage per rank: Linear+Tanh, and a last Linear to one output."""
    import torch

    torch.manual_seed(0)
    widths = [8] + [WIDTH] * (world_size - 1) + [1]
    stages = []
    for rank in range(world_size):
        layer = torch.nn.Linear(widths[rank], widths[rank + 1])
        last = rank == world_size - 1
        stages.append(
            torch.nn.Sequential(layer) if last else torch.nn.Sequential(layer, torch.nn.Tanh())
        )
    return stages


def _driver(world_size: int, steps: int) -> dict:
    """Rank 0: stage 0 here, stage r a RemoteModule on rank r; train it, and the same
    stages (same initial weights) in this process alone."""
    import copy

    import torch
    from torch.distributed.nn import RemoteModule
    from torch.distributed.rpc import RRef

    torch.manual_seed(1)
    x = torch.randn(64, 8)
    y = x.sum(dim=1, keepdim=True) / 4
    reference = _stages(world_size)
    first = copy.deepcopy(reference[0])
    remote = [
        RemoteModule(f"worker{rank}/cpu", torch.nn.Sequential, args=tuple(copy.deepcopy(stage)))
        for rank, stage in enumerate(reference[1:], start=1)
    ]
    parameters = [RRef(p) for p in first.parameters()]
    for module in remote:
        parameters += module.remote_parameters()
    losses = _train([first, *remote], parameters, x, y, steps, distributed=True)
    local = [p for stage in reference for p in stage.parameters()]
    reference_losses = _train(reference, local, x, y, steps, distributed=False)
    trained = [p.detach() for p in first.parameters()]
    for module in remote:
        trained += [p.to_here().detach() for p in module.remote_parameters()]
    return {
        "losses": losses,
        "reference_losses": reference_losses,
        "owners": [module.module_rref.owner_name() for module in remote],
        "max_weight_diff": max(
            float((a - b.detach()).abs().max()) for a, b in zip(trained, local, strict=True)
        ),
    }


def pipeline(steps: int = 30) -> dict:
    """Run on every rank: join the process group and RPC, train from rank 0, leave."""
    import torch
    import torch.distributed as dist

    from sparkdist import torch_rpc

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # Names ("worker0", ...) and the env:// rendezvous come from the runner's environment;
    # shutdown keeps rank 0 (the store's host) up until every rank has left RPC.
    torch_rpc.init_rpc(num_worker_threads=8, rpc_timeout=120)
    result = _driver(world_size, steps) if rank == 0 else {}
    # Every rank has served or sent RPCs by now: who it talked to, before leaving.
    peers = _tcp_peers()
    check = torch.tensor([1.0])
    dist.all_reduce(check)  # the Gloo group still works beside RPC
    torch_rpc.shutdown()
    dist.destroy_process_group()
    env = os.environ
    return {
        **result,
        "rank": rank,
        "gloo_sum": float(check),
        "peers": peers,
        "host": env.get("SPARKDIST_TASK_HOST"),
        "tp_socket_ifname": env.get("TP_SOCKET_IFNAME"),
        "gloo_socket_ifname": env.get("GLOO_SOCKET_IFNAME"),
    }
