"""Sharded checkpoints: every rank writes its own shard with torch.distributed.checkpoint
(DCP) to the job's shared `checkpoint_dir`, and rank 0 commits the step to the driver.

DCP's save is collective: each rank writes its shard, the coordinator (rank 0) gathers
every rank's write results and only then writes the `.metadata` file, and every rank
learns the outcome. So when `dcp.save` returns on rank 0, every shard and the metadata
are down, and rank 0 commits (step, world size, location). A rank lost mid-save leaves
a directory without a commit: never read, removed by a later commit.

An async save (`dcp.async_save`) copies the state into a staging area kept across saves
(the stall training sees) and writes it from a background thread over its own gloo
group, so its collectives never mix with training's; rank 0 commits from that thread
when the write completes. One save is in flight at a time: the next save, `resume` and
the end of `main` wait for it.

Loading (`load`) fills a state laid out for the current world from the shards of any
world: DCP reshards by the global offsets it recorded.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from typing import Any

from sparkdist.checkpoint.driver_record import Resize, commit, place, rank

logger = logging.getLogger(__name__)

KIND = "torch-dcp"


def is_distributed(state: Any) -> bool:
    """Whether `state` holds DTensor or ShardedTensor values (FSDP2, tensor parallel)."""
    import sys

    if "torch" not in sys.modules:
        return False
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor

    todo = [state]
    while todo:
        item = todo.pop()
        if isinstance(item, (DTensor, ShardedTensor)):
            return True
        if isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, (list, tuple)):
            todo.extend(item)
    return False


class _Pending:
    """The async save in flight on this rank, and how its commit went."""

    def __init__(self, step: int, location: str, future: Future):
        self.step, self.location, self.future = step, location, future
        self.committed = threading.Event()
        self.error: BaseException | None = None
        self.grow = False

    def on_written(self, future: Future) -> None:
        """The background write ended (every rank's shard and the metadata, or an error)."""
        try:
            future.result()
            if rank() == 0:
                self.grow = commit(self.step, self.location, KIND) == "grow"
        except BaseException as exc:  # noqa: BLE001 - raised in the training thread
            self.error = exc
        finally:
            self.committed.set()


_pending: _Pending | None = None
_async_group = None
_async_stager = None


def save(state: Any, step: int, *, async_save: bool = False) -> bool:
    """Write `state` (on every rank) as the shards of `step`; rank 0 commits it."""
    import torch.distributed.checkpoint as dcp

    global _pending
    wait()
    location = place(step)
    if not async_save:
        dcp.save(state, checkpoint_id=location)
        if rank() == 0 and commit(step, location, KIND) == "grow":
            raise Resize(step)
        return True
    started = dcp.async_save(
        state, checkpoint_id=location, process_group=_group(), async_stager=_stager()
    )
    future = getattr(started, "upload_completion", started)  # AsyncSaveResponse or Future
    _pending = _Pending(step, location, future)
    future.add_done_callback(_pending.on_written)
    return True


def wait() -> None:
    """Finish this rank's async save in flight, if any: written and (rank 0) committed."""
    global _pending
    pending, _pending = _pending, None
    if pending is None:
        return
    pending.committed.wait()
    if pending.error is not None:
        raise RuntimeError(
            f"the async save of checkpoint {pending.step} failed: {pending.error}"
        ) from pending.error
    if pending.grow:
        raise Resize(pending.step)


def agree(mine: bool) -> bool:
    """Every rank takes rank 0's `mine` (one small broadcast, when a process group is
    formed): a sharded save is collective, so all save at the same step or none does."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return mine
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if (dist.get_backend() == "nccl")
        else torch.device("cpu")
    )
    flag = torch.tensor([1 if mine else 0], dtype=torch.int32, device=device)
    dist.broadcast(flag, src=0)
    return bool(flag.item())


def _group():
    """A gloo group of its own for async saves (created once, on every rank together)."""
    global _async_group
    import torch.distributed as dist

    if _async_group is None and dist.is_available() and dist.is_initialized():
        _async_group = dist.new_group(backend="gloo")
    return _async_group


def _stager():
    """One staging area per rank, kept across saves: DCP's stager then copies into the
    buffers of the previous save instead of allocating the state's size again (the
    copy is the stall training sees). It holds one copy of this rank's shard."""
    global _async_stager
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    if _async_stager is None:
        _async_stager = DefaultStager(StagingOptions(False, False, False, False))
    return _async_stager


def load(record: dict, into: Any) -> Any:
    """Fill `into` in place from the committed shards `record` names; return it."""
    import torch.distributed.checkpoint as dcp

    if into is None:
        raise ValueError(
            f"the newest checkpoint (step {record['step']}) is sharded: pass "
            "resume(into=...) the state to load it into, laid out for this world, e.g. "
            '{"model": get_model_state_dict(model), "optim": get_optimizer_state_dict('
            "model, optim)} (torch.distributed.checkpoint.state_dict), with the same keys "
            "as the state you saved"
        )
    dcp.load(into, checkpoint_id=record["location"])
    logger.info(
        "loaded checkpoint %d (saved by %d ranks) from %s",
        record["step"],
        record["world_size"],
        record["location"],
    )
    return into
