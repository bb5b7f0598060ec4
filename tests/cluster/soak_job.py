"""The chaos soak's training job (issue 64), run by every rank of an in-process elastic
world (`sparkdist.elastic.run`): a deterministic DDP regression at a fixed global batch
over a loader of generated row ids, to a target step.

What the soak's injector cannot do from outside it asks of the job through files in
`control_dir`, named by the rank's pid (or by nobody, for the saver): `stuck-<pid>` (the
rank blocks on a lock in its own code while the file exists), `slow-<pid>` (each step
takes 3x as long while it exists), `exit-<pid>` (the rank calls os._exit, or segfaults if
the file says "segv"), `die-in-save` (the next rank to write a disk checkpoint is killed
half-way through it), `stop-at` (the step to stop at, when the soak has done its faults).

Records (for the soak's invariants): world rank 0 appends every step to
`progress_dir/steps.jsonl` (step, world size, generation, time, the loader's epoch, the
ids the whole world read, the step's loss) and every checkpoint it saved to
`progress_dir/saved.jsonl`; each rank appends its entries to
`progress_dir/events-<pid>.jsonl`. World rank 0 writes a disk checkpoint every
`save_every` steps to `checkpoint_dir` (tmp file, then rename); a full disk skips it
and says so in the events.

`soak_relaunch_main` is the same training as an elastic job on the relaunch path (no
`elastic.run`): every rank starts from `checkpoint.resume()` (model, optimizer, the
loader's `state_dict()`), and `checkpoint.save(..., every=save_every)` keeps the state in
the driver's store (`HorovodRunner(checkpoint_dir=...)`), at once when the job is about
to grow or leave a host. Its generation is the attempt (`checkpoint.attempt()`); a death
in a checkpoint write is a SIGKILL while rank 0's `save` is under way; a full store
fails the save, which is skipped.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from types import SimpleNamespace
from typing import Any

import psutil
from jobs import _append_line

ROW_FEATURES = 8
CHECKPOINT = "latest.pt"
"""The in-process job's own disk checkpoint, in the soak's store (rank 0 writes it)."""


def rows(count: int):
    """The generated rows: x (count x 8) and y, the same on every rank and in every run;
    y has noise, so that the final loss is not near 0 (where 0.5 % means nothing)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(count, ROW_FEATURES, generator=generator)
    noise = torch.randn(count, generator=generator)
    return x, x @ torch.arange(1.0, ROW_FEATURES + 1.0) + 0.5 + noise


def _obey(control_dir: str, pid: int, step_s: float) -> None:
    """Do what the injector asks of this rank before its next step."""
    mine = os.path.join(control_dir, f"%s-{pid}")
    if os.path.exists(mine % "exit"):
        with open(mine % "exit") as f:
            how = f.read().strip()
        if how == "segv":
            ctypes.string_at(0)  # a segmentation fault
        os._exit(3)
    if os.path.exists(mine % "stuck"):
        held = threading.Lock()
        held.acquire()
        while os.path.exists(mine % "stuck"):  # stuck in user code, on a lock nobody frees
            held.acquire(timeout=0.2)
    if os.path.exists(mine % "slow"):
        time.sleep(2 * step_s)  # 3x the step's time


def _saved(progress_dir: str, step: int) -> None:
    """World rank 0 saved the checkpoint of `step` (the soak checks they only increase)."""
    _append_line(os.path.join(progress_dir, "saved.jsonl"), {"step": step, "at": time.time()})


def _save(state, checkpoint_dir: str, control_dir: str, progress_dir: str, log) -> None:
    """World rank 0's disk checkpoint: a tmp file renamed into place; a full disk skips it."""
    import torch

    path = os.path.join(checkpoint_dir, CHECKPOINT)
    blob = {"step": state.step, "model": state.model.state_dict()}
    blob.update(optimizer=state.optimizer.state_dict(), loader=state.loader.state_dict())
    die = os.path.join(control_dir, "die-in-save")
    try:
        with open(path + ".tmp", "wb") as f:
            if os.path.exists(die):
                os.unlink(die)
                f.write(b"half a checkpoint")
                f.flush()
                log(event="dying_in_save", step=state.step)
                os.kill(os.getpid(), signal.SIGKILL)
            torch.save(blob, f)
        os.replace(path + ".tmp", path)
        _saved(progress_dir, state.step)
    except (OSError, RuntimeError) as exc:  # the store is full (torch may wrap ENOSPC)
        log(event="save_failed", step=state.step, error=str(exc))


def _resume(state, checkpoint_dir: str) -> None:
    """A relaunched attempt (a world left below `min_np`) goes on from rank 0's last disk
    checkpoint, as docs/elastic.md tells an in-process job to: without it, it would train
    again from step 0."""
    import torch

    path = os.path.join(checkpoint_dir, CHECKPOINT)
    if os.path.exists(path):
        found = torch.load(path, weights_only=False)
        _restore(state, SimpleNamespace(step=found["step"], state=found))


def soak_main(
    progress_dir: str,
    control_dir: str,
    checkpoint_dir: str,
    target_step: int,
    row_count: int,
    global_batch: int,
    train,
    step_s: float = 0.3,
    save_every: int = 5,
    elastic_timeout_s: float = 8.0,
) -> dict[str, Any] | None:
    """Train to `target_step` at `global_batch` rows a step; returns the final weights and
    loss (a rank that is no longer a member returns None)."""
    import torch

    from sparkdist import elastic

    os.environ["SPARKDIST_ELASTIC_TIMEOUT_S"] = str(elastic_timeout_s)
    pid = os.getpid()
    events = os.path.join(progress_dir, f"events-{pid}.jsonl")
    torch.manual_seed(0)
    x, y = rows(row_count)
    model = torch.nn.Linear(ROW_FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    with train.make_torch_dataloader(
        global_batch_size=global_batch, rank_split="per_step", num_epochs=None, shuffle=True, seed=1
    ) as loader:
        state = elastic.TorchState(model=model, optimizer=optimizer, step=0, loader=loader)
        _resume(state, checkpoint_dir)

        def log(**event) -> None:
            _append_line(events, {**event, "pid": pid, "at": time.time(), "gen": state.generation})

        @elastic.run
        def loop(state) -> dict[str, Any]:
            _entered(log, state)
            ddp = torch.nn.parallel.DistributedDataParallel(state.model, init_sync=False)
            batches = iter(state.loader)
            while state.step < _target(control_dir, target_step):
                _obey(control_dir, pid, step_s)
                _step(state, ddp, x, y, batches, progress_dir)
                if state.rank == 0 and state.step % save_every == 0:
                    _save(state, checkpoint_dir, control_dir, progress_dir, log)
                log(event="stepped", step=state.step)
                state.commit()
                time.sleep(step_s)
            return _final(state, x, y, pid)

        return loop(state)


def _entered(log, state) -> None:
    """The `enter` event the injector finds live ranks by: the pid with the process's start
    time (a pid alone may be another process's minutes later)."""
    host = os.environ["SPARKDIST_TASK_HOST"]
    started = psutil.Process().create_time()
    log(
        event="enter",
        step=state.step,
        rank=state.rank,
        size=state.world_size,
        host=host,
        started=started,
    )


def _target(control_dir: str, target_step: int) -> int:
    """The step to stop at: `target_step`, or the one the soak wrote to `stop-at` (a few
    steps ahead of the world, so that every rank reads it before then)."""
    try:
        with open(os.path.join(control_dir, "stop-at")) as f:
            return int(f.read())
    except (OSError, ValueError):
        return target_step


def _step(state, ddp, x, y, batches, progress_dir: str) -> None:
    """One step at the global batch; world rank 0 records what the world read."""
    import torch.distributed as dist

    from sparkdist import checkpoint

    epoch = state.loader.epoch
    batch = next(batches)
    real = batch["row_weight"] > 0
    ids, weight = batch["id"], batch["row_weight"]
    every: list = [None] * state.world_size
    dist.all_gather_object(every, ids[real].tolist())
    loss = ((ddp(x[ids]).squeeze(1) - y[ids]) ** 2 * weight).sum()
    state.optimizer.zero_grad()
    loss.backward()
    state.optimizer.step()
    state.step += 1
    if state.rank == 0:
        row = {"step": state.step, "world_size": state.world_size, "epoch": epoch}
        row.update(generation=state.generation, attempt=checkpoint.attempt(), at=time.time())
        line = {**row, "ids": [i for part in every for i in part]}
        _append_line(os.path.join(progress_dir, "steps.jsonl"), line)


def soak_relaunch_main(
    progress_dir: str,
    control_dir: str,
    checkpoint_dir: str,
    target_step: int,
    row_count: int,
    global_batch: int,
    train,
    step_s: float = 0.3,
    save_every: int = 5,
    elastic_timeout_s: float = 8.0,
) -> dict[str, Any]:
    """`soak_main`'s training on the relaunch path: from the newest checkpoint to
    `target_step`, a checkpoint every `save_every` steps (`checkpoint_dir` is the
    driver's, given to the runner; `elastic_timeout_s` has no use here)."""
    import torch
    import torch.distributed as dist

    from sparkdist import checkpoint

    dist.init_process_group("gloo")
    pid = os.getpid()
    events = os.path.join(progress_dir, f"events-{pid}.jsonl")
    torch.manual_seed(0)
    x, y = rows(row_count)
    model = torch.nn.Linear(ROW_FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    found = checkpoint.resume()
    with train.make_torch_dataloader(
        global_batch_size=global_batch, rank_split="per_step", num_epochs=None, shuffle=True, seed=1
    ) as loader:
        state = SimpleNamespace(model=model, optimizer=optimizer, loader=loader, step=0)
        state.rank, state.world_size = dist.get_rank(), dist.get_world_size()
        state.generation = checkpoint.attempt()
        if found:
            _restore(state, found)

        def log(**event) -> None:
            _append_line(events, {**event, "pid": pid, "at": time.time(), "gen": state.generation})

        _entered(log, state)
        ddp = torch.nn.parallel.DistributedDataParallel(state.model)
        batches = iter(state.loader)
        while state.step < _target(control_dir, target_step):
            _obey(control_dir, pid, step_s)
            _step(state, ddp, x, y, batches, progress_dir)
            _checkpoint(state, save_every, control_dir, progress_dir, log)
            log(event="stepped", step=state.step)
            time.sleep(step_s)
        out = _final(state, x, y, pid)
    dist.destroy_process_group()
    return out


def _restore(state, found) -> None:
    """Take the state of the checkpoint `found` (`checkpoint.resume()`)."""
    state.step = found.step
    state.model.load_state_dict(found.state["model"])
    state.optimizer.load_state_dict(found.state["optimizer"])
    state.loader.load_state_dict(found.state["loader"])


def _checkpoint(state, save_every: int, control_dir: str, progress_dir: str, log) -> None:
    """`checkpoint.save(..., every=save_every)` of the relaunch path: a full store skips
    it; `die-in-save` kills rank 0 while its save is under way; a grow or a notice ends
    the rank right after the save (`checkpoint.Resize`)."""
    from sparkdist import checkpoint

    blob = {"model": state.model.state_dict(), "optimizer": state.optimizer.state_dict()}
    blob["loader"] = state.loader.state_dict()
    die = os.path.join(control_dir, "die-in-save")
    due = state.rank == 0 and state.step % save_every == 0 and os.path.exists(die)
    if due:
        os.unlink(die)
        log(event="dying_in_save", step=state.step)
        killer = threading.Timer(0.002, os.kill, (os.getpid(), signal.SIGKILL))
        killer.start()
    try:
        saved = checkpoint.save(blob, state.step, every=save_every)
    except checkpoint.Resize:
        _saved(progress_dir, state.step)
        raise
    except RuntimeError as exc:  # the driver's store is full
        log(event="save_failed", step=state.step, error=str(exc))
        return
    if due:
        time.sleep(10)  # the kill lands now if it has not yet
    if saved:
        _saved(progress_dir, state.step)


def _final(state, x, y, pid: int) -> dict[str, Any]:
    """The final weights and loss, as `soak_main` returns them."""
    import torch

    with torch.no_grad():
        final = float(torch.nn.functional.mse_loss(state.model(x).squeeze(1), y))
    weights = [float(v) for p in state.model.parameters() for v in p.reshape(-1)]
    out = {"pid": pid, "rank": state.rank, "size": state.world_size, "step": state.step}
    return {**out, "loss": final, "weights": weights}
