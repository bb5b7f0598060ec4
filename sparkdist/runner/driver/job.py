"""One `HorovodRunner.run` on the driver: launch the job, relaunch it after a failure
that `max_failures` allows, and report what it did.

Each attempt has four steps: *place* (check the cluster's slots, start the job's
authenticated service where the Spark layer says the tasks reach it), *launch* (on
the driver for np < 0, else the job's barrier stage), *wait* (success, the first
failure, or a time limit) and *collect* (stop everything, fill the `JobReport`, log
to MLflow, write the timeline).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from sparkdist import job_environment, tracking
from sparkdist.errors import SparkdistError
from sparkdist.job_environment import JobEnvironment
from sparkdist.network import join_address
from sparkdist.protocol import messages, wire
from sparkdist.protocol.launch import Launch, LaunchSpec
from sparkdist.protocol.payload import driver_pythonpath
from sparkdist.protocol.processes import ProcessRecord
from sparkdist.runner.driver import retry, timeline_file
from sparkdist.runner.driver.checkpoint_store import CheckpointStore
from sparkdist.runner.driver.failures import WorldResize
from sparkdist.runner.driver.job_state import JobSpec, JobState
from sparkdist.runner.driver.local_launch import LOCAL_HOST, LocalLaunch
from sparkdist.runner.driver.metrics import Reported, ReportedMetrics, last_by_rank
from sparkdist.runner.driver.options import RunnerOptions
from sparkdist.runner.driver.relay import RelayPlan
from sparkdist.runner.driver.service import DriverService
from sparkdist.runner.driver.stage import BarrierStage, RelayedStage
from sparkdist.spark import Cluster, ServicePlace, active_cluster, jobs

logger = logging.getLogger(__name__)


@dataclass
class JobReport:
    """What the last job did: kept on the runner as `runner.last_job`."""

    job_id: str
    np: int
    launcher: str
    name: str = "job"
    """What runs: the function's (or script's) name."""
    outcome: str = "running"
    wall_time_s: float = 0.0
    processes: list[ProcessRecord] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)
    frameworks: list[str] = field(default_factory=list)
    """The distributed frameworks rank 0 had imported (torch, horovod, tensorflow...)."""
    attempts: int = 1
    """How many times the job was launched (more than 1 after relaunches)."""
    failures: list[str] = field(default_factory=list)
    """Why each relaunched attempt failed, in order."""
    reported: list[Reported] = field(default_factory=list)
    """Every `sparkdist.report` call of the ranks, in the order the driver got them
    (filled while the job runs)."""

    @property
    def metrics(self) -> dict[str, float]:
        """Rank 0's last reported value of each metric."""
        return self.metrics_by_rank.get(0, {})

    @property
    def metrics_by_rank(self) -> dict[int, dict[str, float]]:
        """Each rank's last reported value of each metric."""
        return last_by_rank(list(self.reported))


def run_job(options: RunnerOptions, blob: bytes, all_results: bool, report: JobReport) -> list[Any]:
    """Run the pickled `(main, kwargs)` on the job's ranks, relaunching as the options
    allow; return every rank's (unpickled) result."""
    metrics = ReportedMetrics(report.reported, options.report_ranks, live=True,
                              label=f"sparkdist {report.name}")  # fmt: skip
    try:
        if options.elastic:
            from sparkdist.runner.driver.elastic import run_elastic_job

            return run_elastic_job(options, blob, all_results, report, metrics)
        return _run_fixed_size(options, blob, all_results, report, metrics)
    finally:
        metrics.close()


def _run_fixed_size(options: RunnerOptions, blob: bytes, all_results: bool, report: JobReport,
                    metrics: ReportedMetrics) -> list[Any]:  # fmt: skip
    cluster = None if options.on_driver else active_cluster()
    place = cluster.service_place() if cluster is not None else ServicePlace(LOCAL_HOST, LOCAL_HOST)
    if place.in_stage:
        _check_in_stage(options)
    # In the stage, checkpoints live where task 0 can write them (checkpoint_dir), not here.
    checkpoints = (
        None if place.in_stage else CheckpointStore(options.checkpoint_dir, options.checkpoint_keep)
    )
    attempt = Attempt(options, cluster, place, report)
    budget = retry.RelaunchBudget(options.max_failures, options.retry_on_exception)
    credentials = messages.SecretEnv(tracking.rank0_credentials())
    try:
        while True:
            job = JobSpec(
                uuid.uuid4().hex[:12], options.num_ranks, blob, all_results,
                options.driver_log_verbosity, options.ranks_per_task, options.roles,
                rank0_env=credentials,
            )  # fmt: skip
            state = JobState(job, checkpoints=checkpoints, metrics=metrics)
            number = report.attempts = len(report.failures) + 1
            try:
                return attempt.run(state, number - 1)
            except BaseException as exc:
                relaunch = budget.relaunch(exc, state)
                if relaunch is None:
                    raise
                report.failures.append(relaunch.reason)
                if not relaunch.counted:
                    logger.warning(
                        "sparkdist job %s: mpirun could not start its daemons before any "
                        "rank started; launching it once more. Open MPI said:\n%s",
                        job.job_id, "\n".join(exc.output_tail),
                    )  # fmt: skip
                    continue
                logger.warning(
                    "sparkdist job %s failed (%s); relaunching it (relaunch %d of at most "
                    "%d), %s", job.job_id, relaunch.reason, budget.used, options.max_failures,
                    _resume_point(checkpoints, options.checkpoint_dir),
                )  # fmt: skip
    finally:
        if checkpoints is not None:
            checkpoints.close()


def _check_in_stage(options: RunnerOptions) -> None:
    """The job's service runs in barrier task 0: say so once, and require storage that
    outlives that task when a relaunch must resume from it."""
    if options.max_failures and options.checkpoint_dir is None:
        raise SparkdistError(
            "the executors cannot reach this Spark Connect client, so the job's service "
            "runs in barrier task 0, and relaunches (max_failures="
            f"{options.max_failures}) resume from checkpoints that must outlive that task: "
            "pass checkpoint_dir= a directory every executor shares (a DBFS path or a Unity "
            "Catalog volume such as /Volumes/..., or a mounted file system)."
        )
    logger.warning(
        "sparkdist: the executors cannot connect to this Spark Connect client, so the job "
        "runs in relay mode: its service runs inside the cluster (barrier task 0), and the "
        "ranks' logs, results and errors arrive here when the job ends, not live."
    )


class Attempt:
    """Launch the job once: place, launch, wait, collect."""

    def __init__(
        self, options: RunnerOptions, cluster: Cluster | None, place: ServicePlace, report
    ):
        self.options = options
        self.cluster = cluster
        self.place = place
        self.report = report

    def run(self, state: JobState, number: int) -> list[Any]:
        report = self.report
        report.job_id = state.job.job_id
        report.outcome = "running"
        secret = wire.new_secret()
        service = self._place(state, secret)
        timeline_path = timeline_file.requested_path(self.options.timeline, os.environ)
        relay = self._relay_plan(state) if self.place.in_stage else None
        driver = join_address(*service.address)
        spec = self.launch_spec(
            state.job.job_id, state.job.num_ranks, driver, secret, number, timeline_path, relay
        )
        where = "on the driver" if self.cluster is None else "on the cluster"
        logger.info(
            "sparkdist job %s: %d ranks, launcher %s, %s",
            report.job_id, spec.num_ranks, report.launcher, where,
        )  # fmt: skip
        if self.cluster is None:
            launch: Launch = LocalLaunch(spec, state)
        else:
            stage = RelayedStage if self.place.in_stage else BarrierStage
            kind = "relayed barrier stage" if self.place.in_stage else "barrier"
            description = self.description(spec.num_ranks, kind, number)
            launch = stage(self.cluster, spec, state, description)
        started = time.monotonic()
        try:
            self.launch_and_wait(launch, state, started)
        finally:
            self.collect(launch, service, state, started, timeline_path)
        return self.results(state)

    def description(self, num_ranks: int, kind: str, number: int) -> str:
        """What the job's Spark stage is called in the Spark UI."""
        return (
            f"sparkdist {self.report.name}: {num_ranks} ranks, {kind}, attempt {number + 1} "
            f"(job {self.report.job_id}){jobs.purpose_suffix()}"
        )

    @staticmethod
    def results(state: JobState) -> list[Any]:
        return [_load_result(r, blob) for r, blob in enumerate(state.results())]

    def _place(self, state: JobState, secret: wire.JobSecret) -> DriverService:
        """Check the cluster can hold the job; start the job's service where the
        executors (or the local ranks) reach it."""
        if self.cluster is not None:
            opts = self.options
            self.cluster.check_slots(state.job.num_ranks, opts.ranks_per_task, opts.start_timeout)
        return DriverService(state, secret, self.place.bind, self.place.advertise)

    def _relay_plan(self, state: JobState) -> RelayPlan:
        opts = self.options
        return RelayPlan(
            job=state.job,
            start_timeout=opts.start_timeout,
            timeout=opts.timeout,
            launcher_expected=self.report.launcher == "mpi",
            checkpoint_dir=opts.checkpoint_dir,
            checkpoint_keep=opts.checkpoint_keep,
        )

    def launch_spec(
        self,
        job_id: str,
        num_ranks: int,
        driver: str,
        secret: wire.JobSecret,
        number: int,
        timeline_path: str | None,
        relay: RelayPlan | None,
    ) -> LaunchSpec:
        """What every task needs to start its part of this attempt."""
        opts = self.options
        rank_env = {**tracking.rank_environment(), **opts.env, job_environment.ATTEMPT: str(number)}
        if timeline_path:
            rank_env[job_environment.HOROVOD_TIMELINE] = timeline_path
        if opts.roles is not None:
            rank_env.update(opts.roles.to_env())
        job = JobEnvironment(
            job_id=job_id,
            driver=driver,
            secret=secret,
            log_mode=opts.driver_log_verbosity,
            launcher=self.report.launcher,
        )
        return LaunchSpec(
            job=job,
            num_ranks=num_ranks,
            env=rank_env,
            mpi_args=opts.mpi_args,
            network_interface=opts.network_interface,
            driver_path=os.environ.get("PATH", ""),
            driver_pythonpath=driver_pythonpath(),
            relay=relay,
            ranks_per_task=opts.ranks_per_task,
        )

    def launch_and_wait(self, launch: Launch, state: JobState, started: float) -> None:
        """Start the job and wait for its end; tell its processes to finish or abort."""
        opts, report = self.options, self.report
        try:
            launch.start()
            launch.wait(
                start_deadline=started + opts.start_timeout,
                deadline=started + opts.timeout if opts.timeout else None,
                launcher_expected=report.launcher == "mpi",
            )
            state.stop("finish", "done")
            report.outcome = "succeeded"
        except BaseException as exc:
            report.outcome = _outcome(exc)
            state.stop("abort", f"job {report.outcome}: {type(exc).__name__}")
            raise

    def collect(
        self,
        launch: Launch,
        service: DriverService,
        state: JobState,
        started: float,
        timeline_path: str | None,
    ) -> None:
        """Stop what the job started, and record what it did (report, MLflow, timeline)."""
        report = self.report
        state.metrics.close()  # the progress line ends before the job's last log lines
        leftovers = launch.stop(finished=report.outcome == "succeeded")
        service.close()
        report.wall_time_s = time.monotonic() - started
        report.processes += [p for p in state.started_processes() if p not in report.processes]
        report.files = dict(state.files)
        report.frameworks = list(state.frameworks)
        tracking.log_job(
            np=self.options.np,
            launcher=report.launcher,
            backend=",".join(report.frameworks) or "none",
            wall_time_s=report.wall_time_s,
            outcome=report.outcome,
        )
        try:
            timeline_file.save_timeline(report.files, timeline_path)
        except OSError as exc:
            logger.warning("could not write the Horovod timeline to %s: %s", timeline_path, exc)
        if leftovers:
            logger.warning("processes of job %s still alive after stop: %s", report.job_id,
                           leftovers)  # fmt: skip
        logger.info("sparkdist job %s %s in %.1fs", report.job_id, report.outcome,
                    report.wall_time_s)  # fmt: skip


def _outcome(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return "resized" if isinstance(exc, WorldResize) else "failed"


def _resume_point(checkpoints: CheckpointStore | None, directory: str | None) -> str:
    if checkpoints is None:
        return f"from the newest checkpoint in {directory}"
    steps = checkpoints.steps()
    return (
        f"from the checkpoint of step {steps[-1]}"
        if steps
        else "from scratch (no checkpoint saved yet)"
    )


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
