"""A small torch model on scikit-learn's digits, trained with DistributedDataParallel.

Each rank trains on its own shard of the training set (rows rank, rank+size, ...);
rank 0 reports the loss and test accuracy after every epoch.
"""

from __future__ import annotations

import time


def load_digits_split(seed: int = 0):
    """Digits scaled to [0, 1], split 80/20 the same way on every rank."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    return train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)


def make_model():
    import torch

    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def accuracy(model, x, y) -> float:
    import torch

    with torch.no_grad():
        predicted = model(torch.from_numpy(x)).argmax(dim=1).numpy()
    return float((predicted == y).mean())


def train_epoch(model, optimizer, x_shard, y_shard, batch_size: int, generator) -> float:
    """One pass over this rank's shard in a random order; returns the mean loss."""
    import torch

    loss_fn = torch.nn.CrossEntropyLoss()
    order = torch.randperm(len(x_shard), generator=generator)
    total, batches = 0.0, 0
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        optimizer.zero_grad()
        loss = loss_fn(model(x_shard[idx]), y_shard[idx])
        loss.backward()
        optimizer.step()
        total += loss.item()
        batches += 1
    return total / batches


def train_digits_ddp(epochs: int = 20, lr: float = 0.01, batch_size: int = 32) -> dict:
    """Train with DDP over Gloo; return rank 0's final test accuracy and timings."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    started = time.time()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    x_train, x_test, y_train, y_test = load_digits_split()
    x_shard = torch.from_numpy(x_train[rank::size])
    y_shard = torch.from_numpy(y_train[rank::size])

    model = DistributedDataParallel(make_model())
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(rank)
    for epoch in range(1, epochs + 1):
        loss = train_epoch(model, optimizer, x_shard, y_shard, batch_size, generator)
        if rank == 0:
            acc = accuracy(model.module, x_test, y_test)
            print(f"epoch {epoch:2d}  loss {loss:.4f}  test accuracy {acc:.4f}", flush=True)
    result = {
        "accuracy": accuracy(model.module, x_test, y_test),
        "ranks": size,
        "train_seconds": time.time() - started,
    }
    dist.destroy_process_group()
    return result
