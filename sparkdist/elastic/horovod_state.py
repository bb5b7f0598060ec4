"""`HorovodState`: `elastic.TorchState` for `horovod.torch` code, whose worlds are Horovod's.

```python
import horovod.torch as hvd

state = elastic.HorovodState(model=model, optimizer=opt, step=0)

@elastic.run
def train(state):  # hvd.init() done: hvd.rank(), hvd.size() are this world's
    ...  # steps with hvd.DistributedOptimizer; state.commit() after each
```

Horovod elastic's `hvd.elastic.TorchState`, in sparkdist's elastic loop: each world is
formed by `horovod_world.form` (`hvd.shutdown()`, then `hvd.init()` with the new world's
place), the state is synced from world rank 0 with `hvd.broadcast_parameters`,
`hvd.broadcast_optimizer_state` and `hvd.broadcast_object`, and a collective that fails
with `HorovodInternalError` sends the survivors back to the last commit. Commits are kept
in memory as `TorchState` keeps them.
"""

from __future__ import annotations

from typing import Any

from sparkdist.elastic import horovod_world
from sparkdist.elastic.generations import Generation, WorldChanged
from sparkdist.elastic.state import TorchState
from sparkdist.protocol.driver_channel import DriverClient


class HorovodState(TorchState):
    """A model, its optimizer (plain or `hvd.DistributedOptimizer`) and any other values,
    for `horovod.torch` code: `HorovodState(model=m, optimizer=opt, step=0)`. Do not call
    `hvd.init()` in code `elastic.run` runs: it forms each world itself."""

    def form_world(
        self, generation: Generation, launch_rank: int, client: DriverClient, limit_s: float
    ) -> horovod_world.HorovodWorld:
        world = horovod_world.form(generation, launch_rank, client, limit_s)
        for value in self.values().values():
            horovod_world.hook_gradients(value)
        return world

    def is_collective_failure(self, exc: BaseException) -> bool:
        return horovod_world.is_collective_failure(exc)

    def same_commit_everywhere(self) -> bool:
        import horovod.torch as hvd

        lineages = hvd.allgather_object(self._lineage, name="sparkdist.elastic.lineage")
        return lineages[0] is not None and all(other == lineages[0] for other in lineages)

    def check_world(self) -> None:
        """Raise `WorldChanged` if the driver formed a newer world, as world rank 0 saw it."""
        if self._group is None:
            return
        import horovod.torch as hvd
        import torch

        seen = self._watcher is not None and self._watcher.newer is not None
        flag = hvd.broadcast(
            torch.tensor([1 if seen else 0], dtype=torch.int32),
            root_rank=0,
            name="sparkdist.elastic.world",
        )
        if flag.item():
            raise WorldChanged(f"generation {self.generation} ends: a newer world formed")

    check_host_updates = check_world

    def _broadcast_stateful(self, names: list[str]) -> None:
        """Optimizers first: `broadcast_optimizer_state` takes a step with zero gradients on
        a rank that has no optimizer state yet (a newcomer), which may move its parameters
        (weight decay); the model's broadcast after it puts them right."""
        import horovod.torch as hvd
        import torch

        def order(name: str) -> int:
            value = getattr(self, name)
            return 0 if isinstance(value, torch.optim.Optimizer) else 1

        for name in sorted(names, key=order):
            value = getattr(self, name)
            if isinstance(value, torch.optim.Optimizer):
                hvd.broadcast_optimizer_state(value, root_rank=0)
            elif isinstance(value, torch.nn.Module):
                hvd.broadcast_parameters(value.state_dict(), root_rank=0)
            else:  # a data loader, an LR scheduler: its state_dict, pickled
                mine = value.state_dict() if self.rank == 0 else None
                tree = hvd.broadcast_object(mine, root_rank=0, name=f"sparkdist.elastic.{name}")
                if self.rank != 0:
                    value.load_state_dict(tree)

    def _broadcast_plain(self, plain: dict[str, Any]) -> dict[str, Any]:
        import horovod.torch as hvd

        return hvd.broadcast_object(plain, root_rank=0, name="sparkdist.elastic.values")
