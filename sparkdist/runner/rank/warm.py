"""A warm world's rank (`HorovodRunner(keep_warm=...)`): one payload after another in
this process, so that what an earlier run imported, or loaded into a module, is there
for the next.

`serve` is the `main` of the world's job, started like any other (`main.py`). For each
run it asks the driver for the next one (`WarmNext`), checks that the payload was signed
for that run (`JobSecret.verify_run`: a payload of an earlier run, or signed with its
key, is refused), sets the job's environment afresh (the variables the rank started
with, the run's job id, a new rendezvous, so a new torch port), runs `main(**kwargs)`
from the directory the rank started in, frees what the run left set up (a torch process
group of its own, torch's CUDA cache; the world's kept group stays, `kept_group.py`), and
says it is done (`WarmDone`). A run that
raises ends the rank as in any job, so that the world is never reused after a failure.
A release (idle too long, closed, another shape wanted) returns.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from sparkdist import job_environment
from sparkdist.errors import SparkdistError
from sparkdist.protocol import messages
from sparkdist.runner.rank import kept_group

logger = logging.getLogger(__name__)

_start: tuple[dict[str, str], str, Any] | None = None
"""The environment and directory the rank started with, and its place in the job."""


def remember_start(env: Mapping[str, str], place: Any) -> None:
    """Called by `main.py` before any backend set its variables: each run starts here."""
    global _start
    _start = (dict(env), os.getcwd(), place)


class RefusedRun(SparkdistError):
    """A run order this rank will not run: not the next run, or not signed for it."""


def check_order(order: messages.WarmRun, after: int, secret) -> None:
    """Refuse an order that is not the run after `after`, or whose payload was not
    signed with this run's key. A rank's first order may be any run: an elastic world's
    relaunched or newly seated rank joins the run in progress."""
    if after and order.run != after + 1:
        raise RefusedRun(f"run {order.run} ordered, but this rank's next run is {after + 1}")
    if not secret.verify_run(order.job_id, order.payload, order.signature):
        raise RefusedRun(f"the payload of run {order.run} is not signed with that run's key")


def serve() -> None:
    """The world job's main: run each run the driver orders until it releases the world."""
    import cloudpickle

    from sparkdist.protocol import driver_channel

    client = driver_channel.driver_client()
    if client is None or _start is None:
        raise SparkdistError("sparkdist's warm-world loop runs only inside a sparkdist rank")
    kept_group.install(client, _start[2].task_host)
    after = 0
    while True:
        order = client.request(messages.WarmNext(after))
        if isinstance(order, messages.WarmRelease):
            logger.info("warm world released: %s", order.reason)
            return
        check_order(order, after, client.secret)
        after = order.run
        value = run_one(order, client)
        blob = b""
        if order.send_result:
            try:
                blob = cloudpickle.dumps(value)
            except Exception as exc:
                raise SparkdistError(
                    f"main returned a value that cannot be pickled: {exc}"
                ) from exc
        from sparkdist.backends import frameworks_in_use

        done = messages.WarmDone(order.run, blob, order.send_result, frameworks_in_use())
        client.request(done)


def run_one(order: messages.WarmRun, client) -> Any:
    """Run one order's `main(**kwargs)` in a fresh job environment; free what it left."""
    from sparkdist import checkpoint, tracking
    from sparkdist.backends import prepare_rank, rank_context
    from sparkdist.protocol import payload

    env, cwd, place = _start
    os.environ.clear()
    os.environ.update({k: v for k, v in env.items() if k not in tracking.TRACKING_ENV})
    os.environ[job_environment.JOB_ID] = order.job_id
    os.environ.update(order.env)  # the driver's MLflow run now, rank 0's credentials
    os.chdir(cwd)
    client.key_prefix = f"{order.job_id}/"  # the run's own rendezvous: a new torch port
    prepare_rank(rank_context(client, place, os.environ))
    tracking.setup_rank()
    fn, kwargs = payload.unpack(order.payload)
    kept_group.begin_run()  # the group an earlier run formed, checked and quiet
    try:
        value = fn(**kwargs)
        checkpoint.wait()  # an async save still in flight is written and committed
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
        value = None
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    tracking.hand_back()
    free_run()
    return value


def free_run() -> None:
    """What a run leaves that would fail or weigh on the next: a torch process group it
    formed itself (the next run's `init_process_group` would raise; the world's kept
    group stays, `kept_group.py`) and torch's cached CUDA memory. What modules hold is
    kept: that is what a warm world is for."""
    kept_group.end_run()
    if "torch" in sys.modules:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            gc.collect()  # the run's tensors no longer referenced, then their blocks
            torch.cuda.empty_cache()
