"""An elastic job (`HorovodRunner(min_np=..., max_np=...)`): a world that starts with the
slots there are, shrinks when ranks are lost and grows when slots free up.

Each attempt submits `max_np` ranks' worth of plain Spark tasks and lets the gang
(`gang.py`) seat the world from those that run: at least `min_np` ranks, as many as
arrive until none has for a moment, at most `max_np`. Then it is an ordinary job (the
same service, tasks, mpirun and ranks as a barrier job) with one more watcher: when
tasks have been standing by with free slots for `GROW_SETTLE_S`, rank 0's next
`sparkdist.checkpoint.save` stops it, and the job relaunches larger from that
checkpoint. A failure outside the training code (a lost executor, a killed rank)
relaunches it at once with the ranks the remaining slots hold; `max_failures` counts
those relaunches, never growth. Every change is one line in the driver's log.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import time
import uuid
from typing import Any

from sparkdist import tracking
from sparkdist.errors import SparkdistError
from sparkdist.network import join_address
from sparkdist.protocol import messages, wire
from sparkdist.protocol.processes import ProcessRecord
from sparkdist.runner.driver import retry, timeline_file
from sparkdist.runner.driver.checkpoint_store import CheckpointStore
from sparkdist.runner.driver.failures import WorldResize
from sparkdist.runner.driver.gang import Gang
from sparkdist.runner.driver.job_state import JobSpec, JobState
from sparkdist.runner.driver.metrics import ReportedMetrics
from sparkdist.runner.driver.options import RunnerOptions
from sparkdist.runner.driver.service import DriverService
from sparkdist.runner.driver.stage import wait_local_gone
from sparkdist.runner.task.spark_task import run_gang_task
from sparkdist.spark import Cluster, active_cluster, job_tag, spark_error_summary

logger = logging.getLogger(__name__)

GROW_SETTLE_S = 5.0
"""How long tasks must stand by with free slots before the job grows into them."""
CANCEL_GRACE_S = 10.0
JOIN_TIMEOUT_S = 60.0


def run_elastic_job(
    options: RunnerOptions, blob: bytes, all_results: bool, report, metrics: ReportedMetrics
) -> list[Any]:
    """Run the pickled `(main, kwargs)` elastically; every rank's result of the last world."""
    cluster = active_cluster()
    cluster.check_elastic(options.size_range[1], options.ranks_per_task)
    place = cluster.service_place()
    if place.in_stage:
        raise SparkdistError(
            "an elastic job (min_np/max_np) needs the executors to reach this Spark Connect "
            "client, which they cannot here: run it from a classic session or a client the "
            "cluster reaches, or drop min_np/max_np"
        )
    checkpoints = CheckpointStore(options.checkpoint_dir, options.checkpoint_keep)
    attempt = _ElasticAttempt(options, cluster, place, report, metrics)
    budget = retry.RelaunchBudget(options.max_failures, options.retry_on_exception)
    world, why = 0, "start"
    try:
        while True:
            number = report.attempts = len(report.failures) + 1
            try:
                return attempt.run(number - 1, blob, all_results, checkpoints, world, why)
            except WorldResize as exc:
                world, why = attempt.world, f"{exc}"
                report.failures.append(f"grew: {exc}")
            except BaseException as exc:
                relaunch = None if attempt.state is None else budget.relaunch(exc, attempt.state)
                if relaunch is None:
                    raise
                world = attempt.world
                report.failures.append(relaunch.reason)
                why = f"{relaunch.reason}; resuming from {_resume_point(checkpoints)}"
                if relaunch.counted:
                    why += f" (relaunch {budget.used} of at most {options.max_failures})"
    finally:
        checkpoints.close()


def _resume_point(checkpoints: CheckpointStore) -> str:
    steps = checkpoints.steps()
    return f"step {steps[-1]}" if steps else "scratch (no checkpoint saved yet)"


class _ElasticAttempt:
    """One world of an elastic job: gang, seat, run, collect."""

    def __init__(self, options: RunnerOptions, cluster: Cluster, place, report, metrics):
        from sparkdist.runner.driver.job import Attempt

        self.metrics = metrics
        self.options = options
        self.cluster = cluster
        self.place = place
        self.report = report
        self.base = Attempt(options, cluster, place, report)
        self.credentials = messages.SecretEnv(tracking.rank0_credentials())
        self.state: JobState | None = None
        self.world = 0

    def run(
        self,
        number: int,
        blob: bytes,
        all_results: bool,
        checkpoints: CheckpointStore,
        previous: int,
        why: str,
    ) -> list[Any]:
        opts, report = self.options, self.report
        per_task = opts.ranks_per_task
        min_np, max_np = opts.size_range
        self.state = None
        job_id = uuid.uuid4().hex[:12]
        report.job_id = job_id
        report.outcome = "running"
        secret = wire.new_secret()
        gang = Gang(secret, self.place.bind, self.place.advertise)
        timeline_path = timeline_file.requested_path(opts.timeline, os.environ)
        # Every task gets the same spec; its seat gives it its index, the world's size and
        # the service's address.
        template = self.base.launch_spec(
            job_id, max_np, "", secret, number, timeline_path, relay=None
        )
        description = self.base.description(
            max_np, f"elastic gang of {max_np // per_task} tasks for {min_np}..{max_np}", number
        )
        tasks = _TaskJob(
            self.cluster, template, gang, max_np // per_task, job_tag(job_id), description
        )
        started = time.monotonic()
        try:
            chosen = gang.form(
                min_np // per_task, max_np // per_task, opts.start_timeout, min_np, max_np
            )
        except BaseException as exc:
            report.outcome = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            gang.close()
            tasks.stop()
            raise
        self.world = num_ranks = len(chosen) * per_task
        logger.warning("sparkdist elastic job: world %s -> %d ranks: %s",
                       previous or "0", num_ranks, why)  # fmt: skip
        job = JobSpec(
            job_id, num_ranks, blob, all_results, opts.driver_log_verbosity, per_task,
            rank0_env=self.credentials,
        )  # fmt: skip
        state = self.state = JobState(job, checkpoints=checkpoints, metrics=self.metrics)
        tasks.state = state
        service = DriverService(state, secret, self.place.bind, self.place.advertise)
        driver = join_address(*service.address)
        spec = dataclasses.replace(
            template, num_ranks=num_ranks, job=dataclasses.replace(template.job, driver=driver)
        )
        gang.seat(chosen, num_ranks, driver)
        watcher = _GrowWatcher(gang, state, num_ranks, max_np, per_task)
        launch = _SeatedWorld(tasks, gang, state, watcher)
        logger.info("sparkdist job %s: %d ranks (elastic %d..%d), launcher %s",
                    job_id, spec.num_ranks, min_np, max_np, report.launcher)  # fmt: skip
        try:
            self.base.launch_and_wait(launch, state, started)
        finally:
            self.base.collect(launch, service, state, started, timeline_path)
        return self.base.results(state)


class _TaskJob:
    """The attempt's Spark job of plain tasks, run from a thread."""

    def __init__(self, cluster: Cluster, template, gang: Gang, num_tasks: int, tag: str,
                 description: str):  # fmt: skip
        self.description = description
        self.cluster = cluster
        self.tag = tag
        self.state: JobState | None = None
        self.cancelled = False
        self.gang = gang
        task = functools.partial(run_gang_task, template, gang.address)
        self._thread = threading.Thread(
            target=self._run, args=(num_tasks, task), name=tag, daemon=True
        )
        self._thread.start()

    def _run(self, num_tasks: int, task) -> None:
        try:
            self.cluster.run_tasks(num_tasks, task, self.tag, self.description)
        except BaseException as exc:  # noqa: BLE001 - reported through the job's state
            if self.cancelled:
                logger.debug("elastic tasks %s ended: %s", self.tag, spark_error_summary(exc))
                return
            if self.state is None:  # the world has not formed yet
                self.gang.fail(f"the Spark job of the elastic tasks failed: "
                               f"{spark_error_summary(exc)}")  # fmt: skip
                return
            self.state.fail(f"the Spark job of the elastic tasks failed: "
                            f"{spark_error_summary(exc)}")  # fmt: skip

    def stop(self) -> None:
        self.cancelled = True
        if self._thread.is_alive():
            logger.info("cancelling the elastic tasks %s", self.tag)
            self.cluster.cancel(self.tag)
            self._thread.join(timeout=JOIN_TIMEOUT_S)


class _GrowWatcher:
    """Asks the world to grow once tasks have stood by for GROW_SETTLE_S."""

    def __init__(self, gang: Gang, state: JobState, world: int, max_np: int, per_task: int):
        self.gang, self.state = gang, state
        self.room = max_np - world
        """Ranks the world may still grow by."""
        self.max_np, self.per_task = max_np, per_task
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sparkdist-grow", daemon=True)

    def start(self) -> None:
        if self.room > 0:
            self._thread.start()

    def _run(self) -> None:
        since = None
        while not self._stop.wait(0.5):
            extra = min(self.gang.standing_by() * self.per_task, self.room)
            if extra <= 0:
                since = None
                continue
            since = since or time.monotonic()
            if time.monotonic() - since >= GROW_SETTLE_S:
                self.state.request_grow(
                    f"{extra} more rank slot(s) free for {GROW_SETTLE_S:.0f}s "
                    f"(max_np={self.max_np})"
                )
                return

    def stop(self) -> None:
        self._stop.set()


class _SeatedWorld:
    """A `launch.Launch` for a seated world: its tasks already run; stopping it lets them
    end, releases the tasks standing by, and cancels the ones Spark has not started."""

    def __init__(self, tasks: _TaskJob, gang: Gang, state: JobState, watcher: _GrowWatcher):
        self.tasks, self.gang, self.state, self.watcher = tasks, gang, state, watcher

    def start(self) -> None:
        self.watcher.start()

    def wait(self, start_deadline: float, deadline: float | None, launcher_expected: bool) -> None:
        self.state.failures.wait(start_deadline, deadline, launcher_expected)

    def stop(self, finished: bool) -> list[ProcessRecord]:
        self.watcher.stop()
        self.state.wait_tasks_done(self.state.live_task_count(), CANCEL_GRACE_S)
        self.gang.close()
        self.tasks.stop()
        return wait_local_gone(self.state)
