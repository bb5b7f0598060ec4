"""A DeepSpeed ZeRO training with a torch optimizer, as written for pyspark's
DeepspeedTorchDistributor: the config comes from `--deepspeed_config` on the command
line (`deepspeed.add_config_arguments`). On CPU DeepSpeed picks its CPU accelerator
and Gloo when oneCCL is absent. Each rank writes its losses and final weights to
OUT/rank-N.json.

    python deepspeed_fit.py OUT --deepspeed --deepspeed_config ds.json
"""

from __future__ import annotations

import argparse
import json
import os


def fit(out: str, steps: int = 6) -> dict:
    import deepspeed
    import torch

    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    args, _ = parser.parse_known_args()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    engine, *_ = deepspeed.initialize(args=args, model=model, optimizer=optimizer)
    rank = engine.global_rank
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(rank + 1))
    y = x.sum(dim=1, keepdim=True)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    result = {
        "rank": rank,
        "world_size": engine.world_size,
        "zero_stage": engine.zero_optimization_stage(),
        "backend": torch.distributed.get_backend(),
        "config": args.deepspeed_config,
        "losses": losses,
        "weights": [p.detach().flatten().tolist() for p in engine.module.parameters()],
    }
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(result, f)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    fit(parser.parse_known_args()[0].out)
