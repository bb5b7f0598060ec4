"""A tiny deterministic DDP training, as people write it for TorchDistributor: the
process group comes from the environment. Each rank trains on its own data, so the
final weights depend on DDP averaging the gradients of both.

As a function, `train(steps, lr=...)` returns what rank 0 saw; as a script,

    python ddp_fit.py --steps 3 --lr 0.1 --out DIR

each rank writes the same to DIR/rank-N.json.
"""

from __future__ import annotations

import argparse
import json
import os


def train(steps: int, lr: float = 0.1, out: str | None = None) -> dict:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(rank + 1))
    y = x.sum(dim=1, keepdim=True)
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    result = {
        "rank": rank,
        "world_size": world,
        "weights": [p.detach().flatten().tolist() for p in model.parameters()],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cwd": os.getcwd(),
    }
    dist.destroy_process_group()
    if out:
        with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
            json.dump(result, f)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    train(args.steps, lr=args.lr, out=args.out)
