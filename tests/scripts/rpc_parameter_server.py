"""A parameter server with `torch.distributed.rpc`, as in PyTorch's parameter-server
tutorial: rank 0 holds the model (an MLP on scikit-learn's bundled digits), ranks
1..N-1 are trainers. Each trainer runs its forward pass on the server through an RRef,
its backward pass with distributed autograd (the gradients land on the server's
parameters) and its update with `DistributedOptimizer`, asynchronously from the other
trainers. When every trainer has reported, rank 0 measures test accuracy.

RPC pickles functions and classes by reference: this module must be importable on every
rank (put tests/scripts on sys.path before importing it).
"""

from __future__ import annotations

import threading

import torch

SEED = 0
HIDDEN = 64
BATCH = 32
LR = 0.3


def _digits() -> tuple:
    """Digits (X/16), split 80/20, stratified, with a fixed seed: (x_train, y_train,
    x_test, y_test) as tensors."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x / 16.0, y, test_size=0.2, stratify=y, random_state=SEED
    )

    def as_tensors(features, labels):
        return torch.tensor(features, dtype=torch.float32), torch.tensor(labels)

    return (*as_tensors(x_train, y_train), *as_tensors(x_test, y_test))


class ParameterServer:
    """The model, on rank 0; trainers reach it through an RRef."""

    def __init__(self) -> None:
        torch.manual_seed(SEED)
        self.hidden = torch.nn.Linear(64, HIDDEN)
        self.out = torch.nn.Linear(HIDDEN, 10)
        self.params = [*self.hidden.parameters(), *self.out.parameters()]
        self.lock = threading.Lock()  # parameters are read whole, written whole
        self.updates = 0
        self.steps: dict[int, int] = {}
        self.done = threading.Condition()

    def forward(self, x):
        """The model on `x`, computed with a snapshot of the parameters: other trainers'
        updates land in place before this trainer's backward pass, which autograd
        refuses for tensors it saved. Gradients flow to the parameters through the
        copies. (Not `torch.func.functional_call`: it swaps the module's parameters in
        place, which concurrent calls on the server's RPC threads would mix up.)"""
        with self.lock:
            w1, b1, w2, b2 = (p.clone() for p in self.params)
        return torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, w1, b1)), w2, b2)

    def parameter_rrefs(self) -> list:
        from torch.distributed.rpc import RRef

        return [RRef(p) for p in self.params]

    def count_update(self) -> None:
        with self.done:
            self.updates += 1

    def trainer_done(self, rank: int, steps: int) -> None:
        with self.done:
            self.steps[rank] = steps
            self.done.notify_all()

    def wait_for_trainers(self, trainers: int, timeout: float) -> None:
        with self.done:
            if not self.done.wait_for(lambda: len(self.steps) == trainers, timeout):
                raise TimeoutError(f"only trainers {sorted(self.steps)} of {trainers} finished")


_server: ParameterServer | None = None
_server_lock = threading.Lock()


def get_parameter_server() -> ParameterServer:
    """The process's one server: trainers create their RRefs to it with `rpc.remote`,
    concurrently, so it is made under a lock."""
    global _server
    with _server_lock:
        if _server is None:
            _server = ParameterServer()
        return _server


class CountingSGD(torch.optim.SGD):
    """SGD that counts, on the server, the updates it applies (one per trainer step).
    Not plain SGD, so DistributedOptimizer runs this Python optimizer (under its lock)."""

    def step(self, closure=None):
        server = get_parameter_server()
        with server.lock:
            loss = super().step(closure)
        server.count_update()
        return loss


def _trainer(rank: int, world_size: int, epochs: int, server: str) -> int:
    """Train on this trainer's shard of the training set; return its steps."""
    import torch.distributed.autograd as dist_autograd
    from torch.distributed import rpc
    from torch.distributed.optim import DistributedOptimizer

    x_train, y_train, _, _ = _digits()
    trainers = world_size - 1
    x, y = x_train[rank - 1 :: trainers], y_train[rank - 1 :: trainers]
    ps = rpc.remote(server, get_parameter_server)
    optimizer = DistributedOptimizer(CountingSGD, ps.rpc_sync().parameter_rrefs(), lr=LR)
    generator = torch.Generator().manual_seed(SEED + rank)
    steps = 0
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), BATCH):
            batch = order[start : start + BATCH]
            with dist_autograd.context() as context:
                loss = torch.nn.functional.cross_entropy(ps.rpc_sync().forward(x[batch]), y[batch])
                dist_autograd.backward(context, [loss])
                optimizer.step(context)
            steps += 1
    ps.rpc_sync().trainer_done(rank, steps)
    return steps


def train(epochs: int = 10, trainer_timeout: float = 300.0) -> dict:
    """Run on every rank: rank 0 serves the model and returns its test accuracy, the
    steps of each trainer and the updates it applied; trainers return their steps."""
    import os

    from sparkdist import torch_rpc

    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world_size < 2:
        raise ValueError("a parameter server needs at least one trainer (world size >= 2)")
    with torch_rpc.rpc_session() as name:
        if rank != 0:
            steps = _trainer(rank, world_size, epochs, torch_rpc.worker_name(0))
            return {"rank": rank, "name": name, "steps": steps}
        server = get_parameter_server()
        server.wait_for_trainers(world_size - 1, trainer_timeout)
    _, _, x_test, y_test = _digits()
    with torch.no_grad():
        predicted = server.forward(x_test).argmax(dim=1)
    return {
        "rank": rank,
        "name": name,
        "accuracy": float((predicted == y_test).float().mean()),
        "steps": dict(sorted(server.steps.items())),
        "updates": server.updates,
        "world_size": world_size,
    }
