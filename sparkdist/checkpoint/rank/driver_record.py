"""A rank's link to the driver's record of checkpoints: the channel, the commit of a
sharded step, `Resume` (what every way of resuming returns), and `Resize`, the answer
that stops rank 0 when an elastic job grows."""

from __future__ import annotations

import os
import time
from typing import Any, NamedTuple

from sparkdist.protocol import driver_channel, messages


def client() -> driver_channel.DriverClient:
    found = driver_channel.driver_client()
    if found is None:
        raise RuntimeError(
            "sparkdist.checkpoint works inside a rank started by HorovodRunner; call it "
            "from the function you pass to HorovodRunner.run"
        )
    return found


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def place(step: int, suffix: str = "") -> str:
    """The path or URL where this job writes the shards of `step` (same on every rank)."""
    reply = client().request(messages.CheckpointPlace(step, suffix))
    if isinstance(reply, messages.Failed):
        raise RuntimeError(f"cannot save sharded checkpoint {step}: {reply.error}")
    return reply.value


def commit(step: int, location: str, kind: str) -> str | None:
    """Rank 0: every shard of `step` is written; the driver records it. Returns the
    driver's answer: "grow" when an elastic job stops here to grow."""
    reply = client().request(messages.CheckpointCommit(step, world_size(), location, kind))
    if isinstance(reply, messages.Failed):
        raise RuntimeError(f"the driver could not commit checkpoint {step}: {reply.error}")
    return reply.value


DUE_POLL_S = 0.2
"""How often `save(..., every=N)` asks the driver, at most, whether to save now."""
_due_asked_at = float("-inf")


def checkpoint_due() -> bool:
    """Whether the driver wants a checkpoint now (the job stops at its next one: to grow,
    or to leave an executor being decommissioned); asked at most every DUE_POLL_S."""
    global _due_asked_at
    now = time.monotonic()
    if now - _due_asked_at < DUE_POLL_S:
        return False
    _due_asked_at = now
    reply = client().request(messages.CheckpointDue())
    return isinstance(reply, messages.Ok) and bool(reply.value)


class Resize(BaseException):
    """Raised by rank 0's `save` in an elastic job that is about to grow (or to leave an
    executor being decommissioned): the checkpoint is stored, the rank stops here, and
    the job relaunches with more (or fewer) ranks from it. A
    BaseException (as SystemExit), so that `except Exception` in training code lets it
    through."""

    def __init__(self, step: int):
        super().__init__(f"stopping after checkpoint {step}: the job grows")
        self.step = step


class Resume(NamedTuple):
    """The newest checkpoint: where a relaunched rank resumes from."""

    step: int
    state: Any
    world_size: int
    """How many ranks the job had when it saved this checkpoint (an elastic job's world
    may have changed since: compare with WORLD_SIZE to rescale)."""
