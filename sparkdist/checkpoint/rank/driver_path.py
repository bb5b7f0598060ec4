"""The driver path: rank 0's pickled state sent over the job's channel to the driver.

Right for states of a few hundred MB at most: each save moves the whole state through
one socket into the driver's memory. Bigger ones are refused here, on the rank, before
anything is sent, with the way out (sharded saves to a shared `checkpoint_dir`).
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any, NamedTuple

import cloudpickle

from sparkdist import job_environment
from sparkdist.checkpoint.rank.driver_record import Resize, client, rank, world_size
from sparkdist.protocol import messages

DRIVER_LIMIT_ENV = job_environment.CHECKPOINT_DRIVER_LIMIT_MB
"""The ranks' environment variable that sets the driver path's limit, in MiB."""
DEFAULT_DRIVER_LIMIT_MB = 512


class _Saved(NamedTuple):
    state: Any
    world_size: int


def driver_limit() -> int:
    """The largest state, in bytes, the driver path sends."""
    raw = os.environ.get(DRIVER_LIMIT_ENV, str(DEFAULT_DRIVER_LIMIT_MB))
    try:
        megabytes = float(raw)
    except ValueError:
        raise ValueError(f"{DRIVER_LIMIT_ENV}={raw!r} must be a number of MiB") from None
    return int(megabytes * 2**20)


def save(state: Any, step: int) -> bool:
    """Rank 0 sends `state` to the driver; other ranks return False at once."""
    if rank() != 0:
        return False
    limit = driver_limit()
    _refuse_over(tensor_bytes(state), limit, step)  # before pickling a huge state
    blob = cloudpickle.dumps(_Saved(state, world_size()))
    _refuse_over(len(blob), limit, step)
    reply = client().request(messages.CheckpointSave(step, blob))
    if isinstance(reply, messages.Failed):
        raise RuntimeError(f"the driver could not store checkpoint {step}: {reply.error}")
    if reply.value == "grow":
        raise Resize(step)
    return True


_MOVED = {"sparkdist.checkpoint.driver_path": __name__}
"""Where the classes of checkpoints saved by an older sparkdist live now."""


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(_MOVED.get(module, module), name)


def unpack(blob: bytes) -> Any:
    """A saved state, also one an older sparkdist saved (its module since moved)."""
    return _Unpickler(io.BytesIO(blob)).load()


def _refuse_over(size: int, limit: int, step: int) -> None:
    if size > limit:
        raise ValueError(
            f"checkpoint {step} is {size / 2**20:.0f} MiB, over the driver path's limit of "
            f"{limit / 2**20:.0f} MiB ({DRIVER_LIMIT_ENV}): states this big are written "
            "sharded by every rank to shared storage instead of through the driver: pass "
            "HorovodRunner(checkpoint_dir=...) a directory every executor sees (/dbfs/..., "
            "/Volumes/..., an fsspec URL) and call checkpoint.save(state, step, sharded=True)"
            f" (or raise {DRIVER_LIMIT_ENV} in the ranks' env)"
        )


def tensor_bytes(state: Any) -> int:
    """The bytes of the tensors and arrays in `state` (nested dicts, lists, tuples)."""
    total, todo, seen = 0, [state], set()
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, (list, tuple)):
            todo.extend(item)
        elif hasattr(item, "nbytes") and isinstance(item.nbytes, int):
            total += item.nbytes  # numpy arrays
        elif hasattr(item, "element_size") and hasattr(item, "nelement"):
            total += item.element_size() * item.nelement()  # torch tensors
    return total
