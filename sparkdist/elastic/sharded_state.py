"""`ShardedTorchState`: an elastic state for models sharded over the world (FSDP2).

FSDP2's `fully_shard` replaces a module's parameters by shards (DTensors) of one process
group; once that group is gone (the world changed) the module cannot be re-wrapped. So the
state does not hold the sharded model across worlds: it holds a `build` function that makes
the model and its optimizer, sharded over the current world, and calls it on each entry of
`elastic.run`, then fills them with the last commit in the new layout:

* from memory (`shard_copies.py`): each rank's shards of its last commits, and with
  `neighbour_copy` its neighbour's; a grow, or a single loss with neighbour copies, reads no
  storage and redoes at most one step;
* else from the last sharded checkpoint the state saved (every `save_every` commits, with
  `sparkdist.checkpoint`, DCP), which DCP reshards into the new layout on load;
* else (no commit survives and none was saved) from `build()`'s fresh model and the state's
  first values.
"""

from __future__ import annotations

import copy
import gc
import logging
import pickle
import time
from collections.abc import Callable
from typing import Any

from sparkdist.elastic import host_copies, shard_copies
from sparkdist.elastic.broadcast import broadcast_object
from sparkdist.elastic.state import State, is_stateful

logger = logging.getLogger(__name__)

MEMORY, STORAGE, START = "memory", "storage", "start"
"""Where a world's state came from (`ShardedTorchState.restored_from`)."""


def _import_before_any_world() -> None:
    """Import `torch.distributed.nn.functional` now, before `elastic.run` forms a group.

    Its functions take `group=group.WORLD` as a default argument, evaluated at import: a
    first import inside a world (FSDP2 and DCP import it) keeps that world's process group
    alive for good, and a gloo group's sockets close only when it is freed."""
    import torch.distributed.nn.functional  # noqa: F401


def _forget_old_meshes() -> None:
    """Drop torch's DTensor caches, which keep the last world's `DeviceMesh`, and through
    it the world's process group, alive after `destroy_process_group` (torch 2.13): the
    redistribute planners (their keys are weak, their values are not), the mesh topology
    and transform caches, and the sharding propagation caches (Python, and the C++ fast
    path's). Gloo has no abort that closes sockets (`shutdown`/`abort` leave them open):
    the old group's sockets close only when it is freed, and until then a survivor whose
    partner in a pending collective has left waits out the elastic timeout. These caches
    are torch's private ones: on a torch without them, a warning, and the timeout."""
    try:
        from torch.distributed.tensor import DTensor, _redistribute
        from torch.distributed.tensor._collective_utils import MeshTopoInfo
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache

        _redistribute.clear_redistribute_planner_cache()
        _redistribute._gen_transform_infos.cache_clear()
        MeshTopoInfo.build_from_mesh.cache_clear()
        DTensor._op_dispatcher.sharding_propagator._propagate_tensor_meta_cached.cache_clear()
        _clear_sharding_prop_cache()  # this thread's: FSDP2 on CPU runs in the training thread
    except (ImportError, AttributeError) as exc:
        logger.warning(
            "elastic: torch's DTensor caches could not be cleared (%s): the old "
            "world's process group may outlive it, and a peer waiting for this "
            "rank may wait out the elastic timeout",
            exc,
        )


class ShardedTorchState(State):
    """A sharded model, its optimizer and any other values, for `elastic.run`.

    ```python
    def build():
        model = Net()
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    state = elastic.ShardedTorchState(build, save_every=50, step=0, data=loader)

    @elastic.run
    def train(state):  # state.model, state.optimizer: sharded over this world, at the commit
        ...
    ```

    `build()` runs on every rank each time a world forms; it returns the model (sharded with
    `fully_shard` over the default process group) and its optimizer. `save_every`: a
    sharded checkpoint (`checkpoint.save(..., sharded=True)`, to the runner's
    `checkpoint_dir`) every that many commits. `neighbour_copy`: keep a copy of the previous
    world rank's shards at each commit, so that one lost rank needs no storage.
    """

    def __init__(
        self,
        build: Callable[[], tuple[Any, Any]],
        *,
        save_every: int,
        neighbour_copy: bool = True,
        **values: Any,
    ) -> None:
        if not callable(build):
            raise TypeError(
                "ShardedTorchState: build must be a function returning "
                "(model, optimizer), sharded over the current world"
            )
        if isinstance(save_every, bool) or not isinstance(save_every, int) or save_every < 1:
            raise ValueError(
                f"save_every must be an int >= 1 (commits between sharded "
                f"checkpoints), got {save_every!r}"
            )
        if {"model", "optimizer"} & set(values):
            raise ValueError("ShardedTorchState: the model and optimizer come from build()")
        super().__init__()
        _import_before_any_world()
        self._build, self.save_every, self.neighbour_copy = build, save_every, neighbour_copy
        self.model: Any = None
        self.optimizer: Any = None
        self._names = list(values)
        for name, value in values.items():
            setattr(self, name, value)
        self._first = self._values_state()
        self.commits = 0
        """Commits so far (restored with the state); the step of its sharded checkpoints."""
        self.restored_from: str | None = None
        """Where the current world's state came from: "memory", "storage" or "start"."""
        self._held = shard_copies.Held()
        self._layouts: dict = {}  # generation -> every rank's piece layout
        self._cpu_group: Any = None
        self._copies = host_copies.DeviceCommits()  # CUDA shards: pinned, on a side stream

    def values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._names}

    def _values_state(self) -> dict[str, Any]:
        return {
            name: copy.deepcopy(value.state_dict() if is_stateful(value) else value)
            for name, value in self.values().items()
        }

    def _load_values(self, saved: dict[str, Any]) -> None:
        for name, value in saved.items():
            current = getattr(self, name)
            if is_stateful(current):
                current.load_state_dict(copy.deepcopy(value))
            else:
                setattr(self, name, copy.deepcopy(value))

    # --- commit -----------------------------------------------------------------------

    def save(self) -> None:
        """Keep this commit in memory (and send it to the neighbour); every `save_every`
        commits, also write it as a sharded checkpoint."""
        self.commits += 1
        self._keep()
        if self._group is not None and self.commits % self.save_every == 0:
            self._save_sharded()

    def _keep(self) -> None:
        if self._group is None:
            return
        mark = shard_copies.Mark(self.generation, self.world_size, self.commits)
        values = {"values": self._values_state(), "commits": self.commits}
        into = self._held.recyclable(self.rank)
        piece, rest = shard_copies.take(self._tree(), mark, self.rank, values, self._copies, into)
        self._held.keep(piece)
        self._held.keep(rest)
        if self.neighbour_copy and self.world_size > 1:
            began = time.perf_counter()
            previous = self._layout(piece)[(self.rank - 1) % self.world_size]
            self._held.keep(shard_copies.exchange(piece, previous, self._cpu_group))
            logger.debug(
                "elastic: commit %d sent to the neighbour in %.4f s",
                self.commits,
                time.perf_counter() - began,
            )

    def _layout(self, piece: shard_copies.Piece) -> list:
        """Every world rank's piece layout (entries, buffer sizes), gathered once a world."""
        import torch.distributed as dist

        if self.generation not in self._layouts:
            layouts: list = [None] * self.world_size
            dist.all_gather_object(layouts, (piece.entries, piece.sizes), group=self._cpu_group)
            self._layouts = {self.generation: layouts}
        layouts = self._layouts[self.generation]
        if layouts[self.rank][1] != piece.sizes:
            raise RuntimeError("ShardedTorchState: the state's shards changed size within a world")
        return layouts

    def _tree(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optim = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optim": optim}

    def _save_sharded(self) -> None:
        from sparkdist import checkpoint

        began = time.perf_counter()
        blob = pickle.dumps({"values": self._values_state(), "commits": self.commits})
        checkpoint.save({**self._tree(), "values": blob}, self.commits, sharded=True)
        logger.info(
            "elastic: sharded checkpoint of commit %d saved in %.2f s",
            self.commits,
            time.perf_counter() - began,
        )

    def restore(self) -> None:
        """Back to the last commit's values. The model and optimizer, sharded over the
        broken world, are dropped now with torch's caches of its mesh, so that its process
        group is freed and its sockets close: a peer still waiting in one of its collectives
        fails at once instead of after the timeout. `sync` builds them again."""
        self.model = self.optimizer = self._cpu_group = None
        _forget_old_meshes()
        gc.collect()
        rests = self._held.rests
        if rests:
            self._apply(rests[-1].values)

    def _apply(self, saved: dict) -> None:
        self._load_values(saved["values"])
        self.commits = saved["commits"]

    # --- a world forms ------------------------------------------------------------------

    def sync(self) -> None:
        """Build the model and optimizer over this world and fill them with the last
        commit: from memory if the world's ranks hold all of it, else from the last
        sharded checkpoint, else from the start."""
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict import set_state_dict

        if self._group is None:
            raise RuntimeError("ShardedTorchState.sync runs inside elastic.run")
        began = time.perf_counter()
        self.model = self.optimizer = None
        _forget_old_meshes()
        gc.collect()  # the last world's shards (and group) go before this world's are made
        self._cpu_group = (
            None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        )  # the copies are in CPU memory
        self.model, self.optimizer = self._build()
        tree = self._tree()
        offers: list = [None] * self.world_size
        dist.all_gather_object(offers, self._held.offers(), group=self._cpu_group)
        chosen = shard_copies.plan(offers)
        stored = self._stored_commit()
        if chosen is not None and chosen.mark.commit >= stored:
            saved = shard_copies.rebuild(tree, chosen, self._held, self.rank, self._cpu_group)
            self.restored_from = MEMORY
        elif stored >= 0:
            saved = self._load_sharded(tree)
            self.restored_from = STORAGE
        else:
            saved = broadcast_object({"values": self._first, "commits": 0}, self.rank)
            self.restored_from = START
        if self.restored_from != START:
            model, optim = tree["model"], tree["optim"]
            set_state_dict(
                self.model, self.optimizer, model_state_dict=model, optim_state_dict=optim
            )
        self._apply(saved)
        self._keep()
        logger.info(
            "elastic: sharded state of commit %d ready for world %d (%d ranks) from %s in %.2f s",
            self.commits,
            self.generation,
            self.world_size,
            self.restored_from,
            time.perf_counter() - began,
        )

    def _stored_commit(self) -> int:
        """The newest commit saved as a sharded checkpoint, -1 if none."""
        from sparkdist import checkpoint

        return max(checkpoint.committed_steps(), default=-1)

    def _load_sharded(self, tree: dict) -> dict:
        from sparkdist import checkpoint

        into = {**tree, "values": b""}
        found = checkpoint.resume(into=into)
        logger.info(
            "elastic: sharded checkpoint of commit %d (saved by %d ranks) loaded into %d ranks",
            found.step,
            found.world_size,
            self.world_size,
        )
        return pickle.loads(into["values"])
