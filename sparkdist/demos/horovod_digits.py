"""The digits model of `digits.py` trained with Horovod (`horovod.torch`).

The steps are those of the HorovodRunner migration guide: `hvd.init()`, pin the GPU by
local rank, shard the data by rank, scale the learning rate by the number of workers,
wrap the optimizer in `hvd.DistributedOptimizer`, broadcast the initial state from rank
0, and write checkpoints on rank 0 only.
"""

from __future__ import annotations

import os
import time


def train_digits_horovod(
    epochs: int = 20,
    lr: float = 0.005,
    batch_size: int = 32,
    checkpoint_dir: str | None = None,
) -> dict:
    """Train with Horovod; return rank 0's test accuracy, the world size, the checkpoints
    rank 0 wrote and the training time."""
    import horovod.torch as hvd
    import torch

    from sparkdist.demos.digits import accuracy, load_digits_split, make_model, train_epoch

    started = time.time()
    hvd.init()  # 1. initialise Horovod
    if torch.cuda.is_available():  # 2. one GPU per process, by local rank
        torch.cuda.set_device(hvd.local_rank())
    torch.manual_seed(0)
    torch.set_num_threads(1)
    rank, size = hvd.rank(), hvd.size()

    x_train, x_test, y_train, y_test = load_digits_split()
    x_shard = torch.from_numpy(x_train[rank::size])  # 3. each rank its own shard
    y_shard = torch.from_numpy(y_train[rank::size])

    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr * size)  # 4. scale the LR
    optimizer = hvd.DistributedOptimizer(  # 5. average gradients across ranks
        optimizer, named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # 6. same start everywhere
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    generator = torch.Generator().manual_seed(rank)
    checkpoints = []
    for epoch in range(1, epochs + 1):
        loss = train_epoch(model, optimizer, x_shard, y_shard, batch_size, generator)
        if rank == 0:  # 7. only rank 0 reports and checkpoints
            acc = accuracy(model, x_test, y_test)
            print(f"epoch {epoch:2d}  loss {loss:.4f}  test accuracy {acc:.4f}")
            if checkpoint_dir:
                path = os.path.join(checkpoint_dir, f"checkpoint-{epoch}.pt")
                torch.save({"model": model.state_dict(), "epoch": epoch}, path)
                checkpoints.append(path)
    result = {
        "accuracy": accuracy(model, x_test, y_test),
        "ranks": size,
        "checkpoints": checkpoints,
        "train_seconds": time.time() - started,
    }
    hvd.shutdown()
    return result
