"""Checkpoints for training functions that should survive a relaunch or a resize.

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

Two paths, one API:

* **driver path** (small states, the default): rank 0's pickled state travels over the
  job's authenticated channel to the driver, which keeps it in
  `HorovodRunner(checkpoint_dir=...)` (or a temporary directory for the run): no shared
  storage needed, a lost executor loses no checkpoint. States over
  `SPARKDIST_CHECKPOINT_DRIVER_LIMIT_MB` (512 MiB by default; set it in the ranks'
  environment, e.g. `HorovodRunner(env={...})`) are refused on the rank before anything
  is sent: the driver's heap and network are shared with Spark.
* **sharded** (`rank/sharded.py`: FSDP2/DTensor state dicts, found automatically, or
  `save(..., sharded=True)`): every rank writes its shard with
  torch.distributed.checkpoint to `checkpoint_dir`, which must then be storage every
  executor sees (`/dbfs/...`, `/Volumes/...`, a mounted file system, an fsspec URL); the
  driver records only the committed step, world size and location. `async_save=True`
  lets training go on while the shards are written. `resume(into=state)` loads the
  newest committed one into the current world's layout, whatever world saved it. Plain
  Python values in the state (a data loader's `state_dict()`, counters) are saved and
  restored with it. TensorFlow jobs use `tf_manager` (`rank/tensorflow.py`) the same way.

In an elastic job (`min_np`/`max_np`) the world may change between launches:
`resume()` also says how many ranks saved the checkpoint, so code can rescale its
learning rate and data shards, and rank 0's `save` ends the rank (`Resize`) when the job
is about to grow (or to leave an executor Spark is decommissioning), right after the
checkpoint is committed (after an async save: at the next `save` or `wait`). Called on
every step as `save(state, step, every=N)`, it saves every N steps and at once when the
job is about to stop there.

Split by process, as `sparkdist.runner` and `sparkdist.data` are: `rank/` is what a rank
runs (this module's API is its front), `driver/` the driver's record of the committed
checkpoints.
"""

from __future__ import annotations

import os
import time
from typing import Any

from sparkdist import job_environment
from sparkdist.checkpoint.rank import driver_path, driver_record
from sparkdist.checkpoint.rank import sharded as shards
from sparkdist.checkpoint.rank.driver_path import DRIVER_LIMIT_ENV, _Saved  # noqa: F401 (old pickles)
from sparkdist.checkpoint.rank.driver_record import Resize, Resume, checkpoint_due, client
from sparkdist.protocol import messages, rank_trace

__all__ = [
    "DRIVER_LIMIT_ENV",
    "Resize",
    "Resume",
    "attempt",
    "committed_steps",
    "latest",
    "resume",
    "save",
    "tf_manager",
    "wait",
]


def save(
    state: Any,
    step: int,
    *,
    sharded: bool | None = None,
    async_save: bool = False,
    every: int | None = None,
) -> bool:
    """Save `state` as the checkpoint of `step` (e.g. epochs done).

    `every=N`: call it on every step; it saves when `step` is a multiple of N, and at
    once when the job is about to stop at its next checkpoint: an elastic job that grows,
    or leaves an executor Spark is decommissioning (a spot instance taken back). Its
    other steps return False without saving (a quick question to the driver at most
    every `DUE_POLL_S`).

    `sharded=None` picks the path from the state: a distributed state (FSDP2/DTensor or
    ShardedTensor values) is written sharded by every rank; anything else goes to the
    driver from rank 0 (other ranks return False at once; `state` must be picklable).
    `sharded=True` writes any state with torch.distributed.checkpoint from every rank
    (call it on every rank); `async_save=True` (sharded only) returns once the state is
    copied and commits when every shard is written: call `wait()` before reading the
    files yourself or destroying the process group (the next `save` and the end of
    `main` wait for it). Returns True
    when this rank's part is done (sharded async: started).
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0 (e.g. the epochs done), got {step!r}")
    use_shards = shards.is_distributed(state) if sharded is None else sharded
    if every is not None and not _due(step, every, use_shards):
        return False
    if async_save and not use_shards:
        raise ValueError(
            "async_save=True writes shards from every rank: pass sharded=True (and a "
            "shared HorovodRunner(checkpoint_dir=...)), or drop async_save"
        )
    started = time.monotonic()
    if use_shards:
        saved = shards.save(state, step, async_save=async_save)
    else:
        shards.wait()
        saved = driver_path.save(state, step)
    if saved:
        rank_trace.checkpoint("save", started, time.monotonic())
    return saved


def _due(step: int, every: int, use_shards: bool) -> bool:
    """Whether `save(..., every=every)` saves at `step`: on its multiples, or when the
    driver asks for a checkpoint now (rank 0 asks; a sharded save is collective, so
    every rank then follows rank 0's answer)."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be an int >= 1 (save every N steps), got {every!r}")
    if step % every == 0:
        return True
    asked = driver_record.rank() == 0 and checkpoint_due()
    return shards.agree(asked) if use_shards else asked


def wait() -> None:
    """Block until this rank's pending async save is written (and, on rank 0,
    committed). Raises `Resize` on rank 0 if the job grows from that checkpoint."""
    shards.wait()


def resume(into: Any = None) -> Resume | None:
    """The newest committed checkpoint with the world size that wrote it, or None.

    A sharded checkpoint is loaded into `into`, a state of the same structure laid out
    for the current world (e.g. `{"model": get_model_state_dict(model), "data":
    loader.state_dict()}`), in place and on every rank: DCP reshards it whatever world
    saved it. Its tensors are filled in and its plain values replaced; then apply it
    (`set_state_dict`, `loader.load_state_dict`). A driver-path checkpoint is returned
    as saved (`into` is not needed).
    """
    shards.wait()
    reply = client().request(messages.CheckpointLatest())
    if reply.value is None:
        return None
    step, found = reply.value
    if isinstance(found, dict) and found.get("kind") != shards.KIND:
        client().request(messages.CheckpointLoaded())
        raise ValueError(
            f"the newest checkpoint (step {step}) is a {found.get('kind')} one: restore it "
            "with checkpoint.tf_manager(tf.train.Checkpoint(...)).restore()"
        )
    if isinstance(found, dict):  # a commit record: shards on shared storage
        try:
            state = shards.load(found, into)
        finally:
            client().request(messages.CheckpointLoaded())
        return Resume(step, state, found["world_size"])
    saved = driver_path.unpack(found)
    if isinstance(saved, _Saved):
        return Resume(step, saved.state, saved.world_size)
    return Resume(step, saved, 0)  # saved by an older sparkdist: size unknown


def latest(into: Any = None) -> tuple[int, Any] | None:
    """(step, state) of the newest checkpoint of this training run, or None."""
    found = resume(into)
    return None if found is None else (found.step, found.state)


def committed_steps() -> list[int]:
    """The steps the driver holds a committed checkpoint of, oldest first."""
    return list(client().request(messages.CheckpointSteps()).value)


def tf_manager(checkpoint: Any, **kwargs: Any):
    """A `tensorflow.TFCheckpoints` for `checkpoint` (a `tf.train.Checkpoint`): the same
    contract for MultiWorkerMirroredStrategy and ParameterServerStrategy jobs."""
    from sparkdist.checkpoint.rank.tensorflow import TFCheckpoints

    return TFCheckpoints(checkpoint, **kwargs)


def attempt() -> int:
    """0 for the first launch of the job, 1 for its first relaunch, and so on."""
    return job_environment.attempt(os.environ)
