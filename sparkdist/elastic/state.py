"""What survives a change of the world: the states `elastic.run` commits, restores and syncs.

Shaped like Horovod elastic's (`horovod.torch.elastic`): `commit()` keeps an in-memory copy
and then stops at a world change (`WorldChanged`), `restore()` goes back to the last commit
after a failed collective, and `sync()` gives every rank world rank 0's state when a world
forms (a newcomer gets it by broadcast, not from storage).
"""

from __future__ import annotations

import copy
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from sparkdist.elastic import broadcast, host_copies, torch_group
from sparkdist.elastic.generations import Generation, Watcher, WorldChanged
from sparkdist.protocol import rank_trace
from sparkdist.protocol.driver_channel import DriverClient, alive

logger = logging.getLogger(__name__)


class State:
    """The base of every elastic state: the world it is in, the commit and the reset
    callbacks. Subclasses say how to `save`, `restore` and `sync` their values."""

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []
        self._group = None  # the world's TorchGroup, while `elastic.run` is inside it
        self._watcher = None
        self._lineage: tuple[int, int] | None = None
        """(the world this state was last synced in, commits since): ranks with equal
        lineages took the same steps from the same state, so they hold the same commit."""
        self.made_commits = 0
        """Commits made in this process (never restored): `elastic.run` tells a world that
        broke with progress since the last break from one stuck at the same commit."""

    @property
    def rank(self) -> int:
        """This rank's place in the current world."""
        return self._group.rank if self._group else int(os.environ.get("RANK", "0"))

    @property
    def world_size(self) -> int:
        return self._group.world_size if self._group else int(os.environ.get("WORLD_SIZE", "1"))

    @property
    def generation(self) -> int:
        """The number of the current world (0: the one the job started with)."""
        return self._group.generation.number if self._group else 0

    def enter_world(self, group: torch_group.TorchGroup, watcher: Watcher) -> None:
        """`elastic.run` is in ``group``'s world (a Horovod state's is a `HorovodWorld`);
        ``watcher`` looks for a newer one, which `commit` reads."""
        self._group, self._watcher = group, watcher

    def leave_world(self, keep_group: bool) -> None:
        """`elastic.run` left the world: its watcher is done; the group stays this state's
        (after success user code may still use it) only with ``keep_group``."""
        self._watcher = None
        if not keep_group:
            self._group = None

    def form_world(
        self, generation: Generation, launch_rank: int, client: DriverClient, limit_s: float
    ) -> torch_group.TorchGroup:
        """Form `generation`'s world for `elastic.run`: a torch process group (a Horovod
        state forms a Horovod world instead)."""
        return torch_group.form(generation, launch_rank, client, limit_s)

    def is_collective_failure(self, exc: BaseException) -> bool:
        """Did `exc` come from a collective of a broken world (then `elastic.run` restores
        the last commit and re-forms)?"""
        return torch_group.is_collective_failure(exc)

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Functions called after the world re-formed, before the state is synced (to
        rescale a learning rate to `world_size`, say), as in Horovod."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Keep the state in memory (what `restore()` returns to), then raise `WorldChanged`
        if the driver formed a newer world. Call it once per step, on every rank."""
        started = time.monotonic()
        self.save()
        rank_trace.checkpoint("commit", started, time.monotonic())
        rank_trace.step("commit")
        alive("commits")  # a sign of life for the driver's stall watch
        self.made_commits += 1
        if self._lineage is not None:
            self._lineage = (self._lineage[0], self._lineage[1] + 1)
        self.check_world()

    def same_commit_everywhere(self) -> bool:
        """Does every rank of the world hold the same commit (the same lineage)? Then a sync
        need not send the tensors: a world that lost a rank broadcasts no model."""
        import torch.distributed as dist

        lineages: list = [None] * self.world_size
        dist.all_gather_object(lineages, self._lineage)
        return lineages[0] is not None and all(other == lineages[0] for other in lineages)

    def check_world(self) -> None:
        """Raise `WorldChanged` if the driver formed a newer world. Every rank decides as
        world rank 0 saw it (one small broadcast), so all stop at the same commit."""
        if self._group is None:
            return
        import torch
        import torch.distributed as dist

        seen = self._watcher is not None and self._watcher.newer is not None
        if self.world_size > 1:  # alone, no one to agree with: no collective, no GPU wait
            flag = torch.tensor([1 if seen else 0], dtype=torch.int32, device=self._group.device)
            dist.broadcast(flag, src=0)
            seen = bool(flag.item())
        if seen:
            raise WorldChanged(f"generation {self.generation} ends: a newer world formed")

    check_host_updates = check_world  # Horovod's name

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def values(self) -> dict[str, Any]:
        """The values this state carries, by name."""
        raise NotImplementedError

    def announce_world(self) -> None:
        """Tell every value that follows the world (has `on_world_change(rank, world_size)`,
        as sparkdist's data loader does) where it now is."""
        for name, value in self.values().items():
            hook = getattr(value, "on_world_change", None)
            if callable(hook):
                logger.debug(
                    "elastic: %s follows the world: rank %d of %d", name, self.rank, self.world_size
                )
                hook(self.rank, self.world_size)


class ObjectState(State):
    """Picklable values, as attributes: `state = ObjectState(epoch=0, best=None)`,
    then `state.epoch += 1`. Committed by deep copy; synced by pickling from world rank 0."""

    def __init__(self, **values: Any) -> None:
        super().__init__()
        self._names = list(values)
        for name, value in values.items():
            setattr(self, name, value)
        self._saved: dict[str, Any] = {}
        self.save()

    def values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._names}

    def save(self) -> None:
        self._saved = {name: copy.deepcopy(getattr(self, name)) for name in self._names}

    def restore(self) -> None:
        for name, value in self._saved.items():
            setattr(self, name, copy.deepcopy(value))

    def sync(self) -> None:
        if self._group is not None:
            for name, value in broadcast.broadcast_object(self.values(), self.rank).items():
                setattr(self, name, value)
        self.save()


def is_stateful(value: Any) -> bool:
    """Does `value` carry its state as `state_dict()` / `load_state_dict()` (modules,
    optimizers, LR schedulers, sparkdist's data loader)?"""
    return callable(getattr(value, "state_dict", None)) and callable(
        getattr(value, "load_state_dict", None)
    )


class TorchState(ObjectState):
    """A model, its optimizer and any other values: `TorchState(model=m, optimizer=opt,
    step=0)`. A value with `state_dict`/`load_state_dict` is committed as a copy of its
    state_dict (tensors cloned to CPU) and synced tensor by tensor; the others as in
    `ObjectState`.

    CUDA tensors are committed into pinned host buffers on a side stream, overlapped with
    the next step (`host_copies`); a restore, a sync or the next commit waits for it, and
    a restore copies them back with `non_blocking`."""

    def __init__(self, model: Any = None, optimizer: Any = None, **values: Any) -> None:
        given = {
            name: v for name, v in (("model", model), ("optimizer", optimizer)) if v is not None
        }
        self._copies: dict[str, host_copies.DeviceCommits] = {}
        """Each stateful value's copier of CUDA tensors (set before `ObjectState.__init__`,
        whose first `save()` uses it)."""
        super().__init__(**given, **values)

    def _stateful(self) -> list[str]:
        return [name for name in self._names if is_stateful(getattr(self, name))]

    def save(self) -> None:
        stateful = set(self._stateful())
        last = self._saved  # its tensors are reused: see `broadcast.snapshot`
        self._saved = {
            name: broadcast.snapshot(
                value.state_dict(),
                into=last.get(name),
                copies=self._copies.setdefault(name, host_copies.DeviceCommits()),
            )
            if name in stateful
            else copy.deepcopy(value)
            for name, value in self.values().items()
        }
        self._saved_stateful = stateful

    def wait_commit(self) -> None:
        """Wait until the last commit's copies of CUDA tensors are in host memory."""
        for copies in self._copies.values():
            copies.wait()

    def restore(self) -> None:
        import torch

        self.wait_commit()
        for name, saved in self._saved.items():
            value = getattr(self, name)
            devices = self._copies[name].devices if name in self._saved_stateful else []
            if name not in self._saved_stateful:
                setattr(self, name, copy.deepcopy(saved))
            elif any(device is not None for device in devices):  # back where it came from
                value.load_state_dict(host_copies.to_devices(saved, devices))
            elif isinstance(value, torch.nn.Module):  # copies into its own tensors
                value.load_state_dict(saved)
            else:  # a fresh copy: an optimizer's load_state_dict may alias its tensors
                value.load_state_dict(broadcast.snapshot(saved))

    def sync(self) -> None:
        """World rank 0's state on every rank. Ranks that all hold the same commit (after a
        loss, or at a grow without newcomers) send only the plain values; their tensors
        stay, and so does the commit: recovery costs no copy of the model."""
        self.wait_commit()
        held = self._group is not None and self.same_commit_everywhere()
        if self._group is not None:
            if not held:
                self._broadcast_stateful(self._stateful())
            every = self._stateful()
            plain = {name: getattr(self, name) for name in self._names if name not in every}
            for name, value in self._broadcast_plain(plain).items():
                setattr(self, name, value)
        if held:  # the tensors are the commit's already
            self._saved.update((name, copy.deepcopy(getattr(self, name))) for name in plain)
        else:
            self.save()
        self._lineage = (self.generation, 0)

    def _broadcast_stateful(self, names: list[str]) -> None:
        """World rank 0's state of each stateful value in `names`, loaded on every rank."""
        for name in names:
            value = getattr(self, name)
            tree = broadcast.broadcast_tree(
                value.state_dict() if self.rank == 0 else None, self.rank, self._group.device
            )
            if self.rank != 0:
                value.load_state_dict(host_copies.to_live_devices(tree, value.state_dict()))

    def _broadcast_plain(self, plain: dict[str, Any]) -> dict[str, Any]:
        """World rank 0's plain values, on every rank."""
        return broadcast.broadcast_object(plain, self.rank)
