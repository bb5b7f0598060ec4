"""One `HorovodRunner.run` on the driver: launch the job, relaunch it after a failure
that `max_failures` allows or when its world is resized, and report what it did.

Every job goes through the one loop of `run_job`, whatever its launch kind
(`launch.api.LaunchKind`: driver-local, barrier, relayed, gang). Each attempt has four
steps: *form* (the kind's: check the slots or seat a gang, start the job's
authenticated service where the tasks reach it), *launch* and *wait* (success, the first
failure, a resize, or a time limit) and *collect* (stop everything, fill the `JobReport`,
log to MLflow, write the timeline). A failure outside the training code is a relaunch
counted by `failures.RelaunchBudget`; a resize (`failures.WorldResize`) is one that is
not. An in-process elastic world's change (`failures.WorldChange`: members lost, or
tasks to grow into) is the loop's third kind of step: the attempt runs on, its world
re-formed in process (a lost member counted by the budget like a relaunch, a grow not);
below min_np its survivors wait, up to start_timeout, for the slots to come back
(`membership.Waits`, counted as a re-form); when that cannot be (none left, the wait ran
out, budget spent), its losses fail the attempt as any loss does. The job's checkpoint
store (`sparkdist/checkpoint/driver/store.py`) is opened once, before the first attempt,
and handed to every attempt, so a relaunch resumes from it.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Mapping
from typing import Any

import cloudpickle

from sparkdist import tracking
from sparkdist.backends.timeline import DYNAMIC, FILE_NAME
from sparkdist.checkpoint.driver.store import CheckpointStore, NoStore
from sparkdist.errors import SparkdistError
from sparkdist.protocol import messages, owned_dirs, wire
from sparkdist.runner.driver.failures import RelaunchBudget, WorldChange, WorldResize
from sparkdist.runner.driver.job_spec import JobReport, Outcome, RunnerOptions
from sparkdist.runner.driver.launch.api import AttemptPlan, LaunchKind, World
from sparkdist.runner.driver.launch.barrier import BarrierKind
from sparkdist.runner.driver.launch.gang_kind import GangKind
from sparkdist.runner.driver.launch.local import DriverLocalKind
from sparkdist.runner.driver.launch.relayed import RelayedKind
from sparkdist.runner.driver.metrics import ReportedMetrics
from sparkdist.runner.driver.rank_logs import RunLogs
from sparkdist.runner.driver.service import DriverService
from sparkdist.runner.driver.stalls import StallWatch, show_where
from sparkdist.spark import active_cluster
from sparkdist.trace.format import FILE_NAME as FILE_NAME_TRACE
from sparkdist.trace.recorder import JobTrace

logger = logging.getLogger(__name__)


def run_job(
    options: RunnerOptions, blob: bytes, all_results: bool, report: JobReport, warm=None
) -> list[Any]:
    """Run the pickled `(main, kwargs)` on the job's ranks, relaunching as the options
    allow; return every rank's (unpickled) result of the last attempt. `warm`: the
    job is a warm world's (`warm.WarmWorld`), whose ranks take runs from that dispatch."""
    metrics = ReportedMetrics(
        report.reported, options.report_ranks, live=True, label=f"sparkdist {report.name}"
    )
    try:
        owned_dirs.sweep()  # what SIGKILLed sparkdist processes left in this host's temp dir
        kind = choose_kind(options)
        checkpoints = open_checkpoints(options, kind)
        try:
            attempt = Attempt(options, report, blob, all_results, metrics, checkpoints, warm)
            return _attempts(options, kind, attempt)
        finally:
            checkpoints.close()
    finally:
        metrics.close()


def choose_kind(options: RunnerOptions) -> LaunchKind:
    """The job's `launch.api.LaunchKind`, chosen once: np < 0: on the driver; min_np or
    max_np: a gang; else a barrier stage, relayed when the executors cannot reach this
    client (where the Spark layer places the job's service says so)."""
    if options.on_driver:
        return DriverLocalKind(options)
    cluster = active_cluster()
    if options.elastic:
        return GangKind(options, cluster)
    place = cluster.service_place()
    if place.in_stage:
        return RelayedKind(options, cluster, place)
    return BarrierKind(options, cluster, place)


def open_checkpoints(options: RunnerOptions, kind: LaunchKind) -> CheckpointStore | NoStore:
    """The job's one checkpoint store, kept across its attempts. A relayed job's is kept
    by its barrier task 0 (`launch/relayed.py`), in storage this client may not see."""
    if isinstance(kind, RelayedKind):
        return NoStore(options.checkpoint_dir)
    return CheckpointStore(options.checkpoint_dir, options.checkpoint_keep)


def _attempts(options: RunnerOptions, kind: LaunchKind, attempt: Attempt) -> list[Any]:
    """The one relaunch loop: until an attempt succeeds or may not be relaunched."""
    report = attempt.report
    budget = RelaunchBudget(options.relaunch_limit, options.retry_on_exception)
    why, running = "start", False
    while True:
        try:
            if running:  # the same attempt, its world re-formed in process
                return attempt.carry_on()
            report.attempts = len(report.failures) + 1
            return attempt.run(kind, report.attempts - 1, why)
        except WorldChange as change:
            running = True
            world = attempt.world
            assert world is not None
            membership = world.state.membership
            if change.grow or change.leave:  # not a fault: not counted
                if kind.change_in_process(world, change):
                    report.reformed.append(f"{'grew' if change.grow else 'left'}: {change.reason}")
            elif membership.can_shrink() and budget.reform():
                kind.change_in_process(world, change)
                report.reformed.append(change.reason)
            elif membership.can_wait() and budget.reform():  # below min_np: wait for slots
                membership.hold(options.start_timeout)
                report.reformed.append(f"waited: {change.reason}")
            else:  # none left, no slot back in time, no fault left: relaunch or fail as ever
                losses, counted = membership.refuse()
                budget.returned(counted)  # the relaunch counts the faults the wait counted
                world.state.losses.refused(losses)
        except WorldResize as exc:
            running = False
            report.failures.append(f"{'left' if exc.left else 'grew'}: {exc}")
            why = f"{exc}"
        except BaseException as exc:
            running = False
            state = attempt.world.state if attempt.world is not None else None
            relaunch = None if state is None else budget.relaunch(exc, state.failures)
            if relaunch is None:
                raise
            report.failures.append(relaunch.reason)
            resume_point = state.checkpoints.resume_point()  # a warm world's: its run's
            why = kind.relaunching(report.job_id, relaunch, budget, resume_point)


class Attempt:
    """Launch the job once, in any kind: form, launch, wait, collect."""

    def __init__(
        self,
        options: RunnerOptions,
        report: JobReport,
        blob: bytes,
        all_results: bool,
        metrics: ReportedMetrics,
        checkpoints: CheckpointStore | NoStore,
        warm=None,
    ):
        self.options = options
        self.warm = warm
        self.report = report
        self.blob = blob
        self.all_results = all_results
        self.metrics = metrics
        self.checkpoints = checkpoints
        # A store in a directory the user named also keeps the rank logs (copied there).
        copy_to = options.checkpoint_dir if isinstance(checkpoints, CheckpointStore) else None
        self.rank_logs = RunLogs(copy_to)
        self.credentials = messages.SecretEnv(tracking.rank0_credentials())
        self.world: World | None = None
        """The world of the attempt running or just ended; None if none formed."""
        self.timeline_path: str | None = None
        self.trace = JobTrace(name=report.name, enabled=options.trace)
        """The job's trace, across its attempts (`sparkdist/trace/recorder.py`)."""

    def run(self, kind: LaunchKind, number: int, why: str) -> list[Any]:
        """Form the attempt's world, launch it and wait for it (`carry_on`)."""
        report = self.report
        self.world = None
        report.job_id = uuid.uuid4().hex[:12]
        report.outcome = Outcome.RUNNING
        plan = AttemptPlan(
            self.options,
            number,
            report.job_id,
            wire.new_secret(),
            _timeline_path(self.options.timeline, os.environ),
            report.name,
            report.launcher,
            self.blob,
            self.all_results,
            self.metrics,
            self.credentials,
            self.checkpoints,
            self.rank_logs,
            self.warm,
            self.trace,
        )
        self.trace.job_id = self.trace.job_id or report.job_id
        self.trace.attempt_started(number, why, self.options.ranks_per_task, self.options.num_ranks)
        try:
            self.world = kind.form(plan, why)
        except BaseException as exc:
            report.outcome = _outcome(exc)
            raise
        self.timeline_path = plan.timeline_path
        return self.carry_on(start=True)

    def carry_on(self, start: bool = False) -> list[Any]:
        """Wait for the attempt's world (`start`: launch it first); then collect it and
        return its members' results, in world-rank order. A `WorldChange` leaves the
        world running, for the loop to re-form."""
        world = self.world
        assert world is not None
        try:
            self.launch_and_wait(world, start)
        except WorldChange:
            raise
        except BaseException:
            self.collect(world, self.timeline_path)
            raise
        self.collect(world, self.timeline_path)
        return [_load_result(r, b) for r, b in world.state.results()]

    def launch_and_wait(self, world: World, start: bool) -> None:
        """Start the job (if `start`) and wait for its end; tell its processes to finish
        or abort."""
        opts, report, state = self.options, self.report, world.state
        try:
            if start:
                _trace_world(self.trace, state, why="start")
                self.trace.stage_submitted()
                world.launch.start()
            with StallWatch(state, opts, report.job_id, _announce):
                world.launch.wait(
                    start_deadline=world.started + opts.start_timeout,
                    deadline=world.started + opts.timeout if opts.timeout else None,
                    launcher_expected=report.launcher == "mpi",
                )
            state.stop("finish", "done")
            report.outcome = Outcome.SUCCEEDED
        except WorldChange:
            raise  # not an end: the world runs on
        except BaseException as exc:
            report.outcome = _outcome(exc)
            show_where(state, exc, _announce)  # before the ranks are stopped
            state.stop("abort", f"job {report.outcome}: {type(exc).__name__}")
            raise

    def collect(self, world: World, timeline_path: str | None) -> None:
        """Stop what the job started, and record what it did (report, MLflow, timeline)."""
        report, state = self.report, world.state
        state.metrics.close()  # the progress line ends before the job's last log lines
        leftovers = world.launch.stop(finished=report.outcome == Outcome.SUCCEEDED)
        world.service.close()
        if isinstance(world.service, DriverService):
            report.driver_connections_max = world.service.connections_max
            report.payload_bytes_sent = world.service.payload_bytes_sent
        state.console.close()  # the held rank lines show before the job's result or error
        if state.console.log_dir is not None:
            report.rank_logs = str(state.console.log_dir)
        report.wall_time_s = time.monotonic() - world.started
        report.processes += [p for p in state.processes.started() if p not in report.processes]
        report.files = dict(state.files)
        report.frameworks = list(state.rank_records.frameworks)
        report.stragglers = list(state.life.stragglers.notes)
        if self.warm is None:  # a warm world's runs are logged each (`warm.py`)
            tracking.log_job(
                np=self.options.np,
                launcher=report.launcher,
                backend=",".join(report.frameworks) or "none",
                wall_time_s=report.wall_time_s,
                outcome=report.outcome,
            )
        try:
            _save_timeline(report.files, timeline_path)
        except OSError as exc:
            logger.warning("could not write the Horovod timeline to %s: %s", timeline_path, exc)
        self.trace.attempt_ended(str(report.outcome))
        if self.trace.enabled:
            report.trace = _write_trace(self.trace, self.rank_logs, log=self.warm is None)
        if leftovers:
            logger.warning(
                "processes of job %s still alive after stop: %s", report.job_id, leftovers
            )
        logger.info(
            "sparkdist job %s %s in %.1fs", report.job_id, report.outcome, report.wall_time_s
        )


def _announce(text: str) -> None:
    """Where each rank is (a stall warning, an interrupt), or a straggler, on the driver."""
    logger.warning("%s", text)


def _timeline_path(option: str | None, environ: Mapping[str, str]) -> str | None:
    """Where the job's Horovod timeline was asked for on the driver: the runner option,
    else HOROVOD_TIMELINE (rank 0 records it, `backends/timeline.py`, and sends it)."""
    path = option if option is not None else environ.get("HOROVOD_TIMELINE")
    return path or None


def _save_timeline(files: Mapping[str, bytes], path: str | None) -> str | None:
    """Write the timeline rank 0 sent (if any) at `path`."""
    if not path or path == DYNAMIC or FILE_NAME not in files:
        return None
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial = f"{path}.partial"
    with open(partial, "wb") as f:
        f.write(files[FILE_NAME])
    os.replace(partial, path)
    logger.info("Horovod timeline written to %s", path)
    return path


def _trace_world(trace: JobTrace, state, why: str) -> None:
    """The world's size as an attempt starts (an in-process world's generation 0)."""
    generation = state.membership.generation
    in_process = state.job.in_process_min_np is not None
    trace.world(len(generation.members), generation.number if in_process else None, why)


def _write_trace(trace: JobTrace, logs: RunLogs, log: bool) -> str | None:
    """Write the job's trace beside its rank logs (and, with `log`, into the active MLflow
    run, with its picture); its path, None if it could not be written."""
    try:
        path = logs.keep(FILE_NAME_TRACE, trace.to_json(), trace.job_id)
    except OSError as exc:
        logger.warning("could not write the job's trace: %s", exc)
        return None
    logger.info("sparkdist job trace written to %s", path)
    if log and tracking.active():
        from sparkdist.trace.picture import Timeline

        picture = path.with_name("timeline.html")
        Timeline.load(path).save_html(picture)
        tracking.log_files([str(path), str(picture)])
    return str(path)


def _outcome(exc: BaseException) -> Outcome:
    if isinstance(exc, KeyboardInterrupt):
        return Outcome.INTERRUPTED
    return Outcome.RESIZED if isinstance(exc, WorldResize) else Outcome.FAILED


def _load_result(rank: int, blob: bytes | None) -> Any:
    if blob is None:
        return None
    try:
        return cloudpickle.loads(blob)
    except Exception as exc:  # noqa: BLE001
        raise SparkdistError(
            f"rank {rank}'s return value cannot be unpickled on the driver: {exc}. Return "
            "plain Python/numpy values (e.g. a state_dict converted with .tolist() or "
            "saved to a file) or install the same libraries on the driver."
        ) from exc
