"""Checkpoints for training functions that should survive a relaunch.

With `HorovodRunner(np=..., max_failures=k)`, a job whose rank was lost (killed, its
executor or host gone) is started again, up to k times. `main` resumes instead of
starting over by asking for the newest checkpoint:

    from sparkdist import checkpoint

    def main(epochs):
        model, opt = make_model(), make_optimizer()
        start = 0
        found = checkpoint.latest()          # (step, state) or None, on every rank
        if found:
            start, state = found
            model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"])
        for epoch in range(start, epochs):
            train_one_epoch(model, opt)
            checkpoint.save({"model": model.state_dict(), "opt": opt.state_dict()},
                            step=epoch + 1)  # only rank 0 writes; others return at once

In an elastic job (`min_np`/`max_np`) the world may change between launches:
`resume()` also says how many ranks saved the checkpoint, so code can rescale its
learning rate and data shards, and rank 0's `save` ends the rank (`Resize`) when the job
is about to grow, right after the checkpoint is stored.

Checkpoints travel to the driver over the job's authenticated channel and are kept
there (in `HorovodRunner(checkpoint_dir=...)`, or a temporary directory for the run),
so the executors need no shared storage and a lost executor loses no checkpoint.
Keep them to what resuming needs (weights, optimizer state, counters): each save sends
the whole state to the driver.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import cloudpickle

from sparkdist import job_environment
from sparkdist.runner.protocol import messages
from sparkdist.runner.rank import channel as rank_channel


def _client() -> rank_channel.DriverClient:
    client = rank_channel.driver_client()
    if client is None:
        raise RuntimeError(
            "sparkdist.checkpoint works inside a rank started by HorovodRunner; call it "
            "from the function you pass to HorovodRunner.run"
        )
    return client


def save(state: Any, step: int) -> bool:
    """Save `state` as the checkpoint of `step` (e.g. epochs done) on the driver.

    Only rank 0 saves (the ranks of a data-parallel job hold the same state); on other
    ranks this returns False at once. `state` must be picklable (torch tensors and
    state_dicts are). Returns True when the driver has stored it.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0 (e.g. the epochs done), got {step!r}")
    if int(os.environ.get("RANK", "0")) != 0:
        return False
    saved = _Saved(state, int(os.environ.get("WORLD_SIZE", "1")))
    reply = _client().request(messages.CheckpointSave(step, cloudpickle.dumps(saved)))
    if isinstance(reply, messages.Failed):
        raise RuntimeError(f"the driver could not store checkpoint {step}: {reply.error}")
    if reply.value == "grow":
        raise Resize(step)
    return True


def latest() -> tuple[int, Any] | None:
    """(step, state) of the newest checkpoint of this training run, or None."""
    found = resume()
    return None if found is None else (found.step, found.state)


class Resume(NamedTuple):
    """The newest checkpoint: where a relaunched rank resumes from."""

    step: int
    state: Any
    world_size: int
    """How many ranks the job had when it saved this checkpoint (an elastic job's world
    may have changed since: compare with WORLD_SIZE to rescale)."""


def resume() -> Resume | None:
    """The newest checkpoint with the world size that wrote it, or None."""
    reply = _client().request(messages.CheckpointLatest())
    if reply.value is None:
        return None
    step, blob = reply.value
    saved = cloudpickle.loads(blob)
    if isinstance(saved, _Saved):
        return Resume(step, saved.state, saved.world_size)
    return Resume(step, saved, 0)  # saved by an older sparkdist: size unknown


class _Saved(NamedTuple):
    state: Any
    world_size: int


class Resize(BaseException):
    """Raised by rank 0's `save` in an elastic job that is about to grow: the checkpoint
    is stored, the rank stops here, and the job relaunches with more ranks from it. A
    BaseException (as SystemExit), so that `except Exception` in training code lets it
    through."""

    def __init__(self, step: int):
        super().__init__(f"stopping after checkpoint {step}: the job grows")
        self.step = step


def attempt() -> int:
    """0 for the first launch of the job, 1 for its first relaunch, and so on."""
    return job_environment.attempt(os.environ)
