"""`HorovodRunner`: the public entry point of the runner path.

    HorovodRunner(np=2).run(main, lr=0.1)

pickles `main` and its arguments here, on the driver, runs `main(**kwargs)` on every
rank, and returns rank 0's value. See docs/architecture.md for the data flow, which
module runs in which process, the messages and the environment contract.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from sparkdist import job_environment, tracking
from sparkdist.job_environment import JobEnvironment
from sparkdist.network import join_address
from sparkdist.runner import payload, retry, timeline_file, wire
from sparkdist.runner.checkpoint_store import CheckpointStore
from sparkdist.runner.driver import DriverService
from sparkdist.runner.errors import SparkdistError
from sparkdist.runner.job_state import JobSpec, JobState
from sparkdist.runner.launch import Launch, LaunchSpec
from sparkdist.runner.local_launch import LOCAL_HOST, LocalLaunch
from sparkdist.runner.options import RunnerOptions
from sparkdist.runner.processes import ProcessRecord
from sparkdist.runner.relay import RelayPlan
from sparkdist.runner.script import ScriptMain
from sparkdist.runner.spark_cluster import BarrierStage, RelayedStage, active_spark

logger = logging.getLogger(__name__)


@dataclass
class JobReport:
    """What the last job did: kept on the runner as `runner.last_job`."""

    job_id: str
    np: int
    launcher: str
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


class HorovodRunner:
    """Run a training function on `np` ranks placed by a Spark barrier stage.

    Args:
        np: number of ranks. `np > 0`: on the cluster, one Spark barrier task per rank
            (or per `ranks_per_task` ranks).
            `np < 0`: `-np` ranks as subprocesses of the driver (for debugging).
        driver_log_verbosity: "all" streams every rank's stdout/stderr to the driver,
            each line prefixed with its rank; "log_callback_only" shows only
            `sparkdist.log_to_driver` messages (and errors).
        launcher: "mpi" (mpirun started inside the barrier stage), "direct" (each
            task starts its ranks itself, no MPI), or "auto": mpi when `mpirun` is
            installed.
        start_timeout: seconds for the barrier stage to get its slots and every
            rank to start.
        timeout: seconds for the whole job; None for no limit.
        env: extra environment variables for the ranks.
        mpi_args: extra arguments for mpirun (e.g. ["--mca", "btl_tcp_links", "2"]).
        network_interface: the interface (e.g. "eth0") the ranks and sparkdist's
            channels use; by default the one carrying each executor's address.
        timeline: a path on the driver for a Horovod timeline of the job (rank 0
            records it wherever it runs; the driver writes it here). By default the
            driver's HOROVOD_TIMELINE environment variable, as on Databricks.
        max_failures: how many times a job that failed for a reason outside the
            training code (a lost executor or host, a killed rank) is relaunched as a
            whole. `main` resumes from `sparkdist.checkpoint.latest()`.
        retry_on_exception: also relaunch when the training code raised (by default an
            exception in `main` fails the job at once: a relaunch would repeat it).
        checkpoint_dir: a directory on the driver for the checkpoints ranks save with
            `sparkdist.checkpoint.save`; kept, so a later run resumes from it. By
            default a temporary directory, removed when `run` returns.
        ranks_per_task: ranks each Spark barrier task starts (`np > 0`; np must be a
            multiple). Ranks of one task share its resources: with
            `spark.task.resource.gpu.amount=4` and ranks_per_task=4, each task's four
            ranks split its four GPUs. Local ranks count within a task.
    """

    def __init__(
        self,
        *,
        np: int,
        driver_log_verbosity: str = "all",
        launcher: str = "auto",
        start_timeout: float = 600.0,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        mpi_args: Sequence[str] = (),
        network_interface: str | None = None,
        timeline: str | os.PathLike | None = None,
        max_failures: int = 0,
        retry_on_exception: bool = False,
        checkpoint_dir: str | os.PathLike | None = None,
        ranks_per_task: int = 1,
    ):
        self.options = RunnerOptions(
            np=np,
            driver_log_verbosity=driver_log_verbosity,
            launcher=launcher,
            start_timeout=start_timeout,
            timeout=timeout,
            env=env or {},
            mpi_args=mpi_args,
            network_interface=network_interface,
            timeline=timeline,
            max_failures=max_failures,
            retry_on_exception=retry_on_exception,
            checkpoint_dir=checkpoint_dir,
            ranks_per_task=ranks_per_task,
        )
        self.last_job: JobReport | None = None

    def run(self, main: Callable[..., Any] | str | os.PathLike, **kwargs: Any) -> Any:
        """Run `main(**kwargs)` on every rank; return rank 0's return value.

        `main` may also be the path of a Python script, run on every rank as
        `__main__` with `args` as its command-line arguments:
        `run("train.py", args=["--epochs", "3"])`. A non-zero exit is a failure.
        """
        return self._run(main, kwargs, all_results=False)[0]

    def run_all(self, main: Callable[..., Any] | str | os.PathLike, **kwargs: Any) -> list[Any]:
        """Like `run`, but return every rank's value, in rank order."""
        return self._run(main, kwargs, all_results=True)

    # -----------------------------------------------------------------------------------

    def _run(self, main: Callable | str | os.PathLike, kwargs: dict[str, Any], all_results: bool):
        if isinstance(main, (str, os.PathLike)):
            unexpected = set(kwargs) - {"args"}
            if unexpected:
                raise ValueError(
                    f"a script takes only args=[...], not {sorted(unexpected)}; pass options "
                    "to the script as command-line arguments"
                )
            main, kwargs = ScriptMain.from_file(main, kwargs.get("args", ())), {}
        kwargs = _convert_dataframes(kwargs)
        blob = payload.pack(main, kwargs)
        opts = self.options
        report = JobReport(job_id="", np=opts.np, launcher=opts.resolved_launcher())
        self.last_job = report
        cluster = None if opts.on_driver else active_spark()
        relay = cluster is not None and not cluster.executors_reach_client()
        if relay:
            self._check_relay()
        # Relayed, checkpoints live where task 0 can write them (checkpoint_dir), not here.
        checkpoints = CheckpointStore(opts.checkpoint_dir) if not relay else None
        try:
            attempt = 0
            while True:
                job = JobSpec(
                    uuid.uuid4().hex[:12], opts.num_ranks, blob, all_results,
                    opts.driver_log_verbosity, opts.ranks_per_task,
                )  # fmt: skip
                state = JobState(job, checkpoints=checkpoints)
                report.attempts = attempt + 1
                try:
                    return self._attempt(state, report, attempt, cluster, relay)
                except BaseException as exc:
                    reason = retry.retry_reason(exc, state, opts.retry_on_exception)
                    if reason is None or attempt >= opts.max_failures:
                        raise
                    attempt += 1
                    report.failures.append(reason)
                    logger.warning(
                        "sparkdist job %s failed (%s); relaunching it (relaunch %d of at most "
                        "%d), %s", job.job_id, reason, attempt, opts.max_failures,
                        _resume_point(checkpoints, opts.checkpoint_dir),
                    )  # fmt: skip
        finally:
            if checkpoints is not None:
                checkpoints.close()

    def _check_relay(self) -> None:
        """Relay mode (executors cannot reach this client): say so once, and require
        storage that outlives barrier task 0 when a relaunch must resume from it."""
        opts = self.options
        if opts.max_failures and opts.checkpoint_dir is None:
            raise SparkdistError(
                "the executors cannot reach this Spark Connect client, so the job's service "
                "runs in barrier task 0, and relaunches (max_failures="
                f"{opts.max_failures}) resume from checkpoints that must outlive that task: "
                "pass checkpoint_dir= a directory every executor shares (a DBFS path or a Unity "
                "Catalog volume such as /Volumes/..., or a mounted file system)."
            )
        logger.warning(
            "sparkdist: the executors cannot connect to this Spark Connect client, so the job "
            "runs in relay mode: its service runs inside the cluster (barrier task 0), and the "
            "ranks' logs, results and errors arrive here when the job ends, not live."
        )

    def _attempt(
        self, state: JobState, report: JobReport, attempt: int, cluster, relay: bool
    ) -> list[Any]:
        """Launch the job once: place it, launch it, wait for it, collect what it left;
        return every rank's (unpickled) result."""
        report.job_id = state.job.job_id
        report.outcome = "running"
        secret = wire.new_secret()
        service = self._place(state, secret, cluster)
        timeline_path = timeline_file.requested_path(self.options.timeline, os.environ)
        launch_spec = self._launch_spec(
            state, service, secret, attempt, report, relay, timeline_path
        )
        where = "on the driver" if cluster is None else "on the cluster"
        logger.info(
            "sparkdist job %s: %d ranks, launcher %s, %s",
            report.job_id, launch_spec.num_ranks, report.launcher, where,
        )  # fmt: skip
        if cluster is None:
            launch: Launch = LocalLaunch(launch_spec, state)
        else:
            launch = (RelayedStage if relay else BarrierStage)(cluster, launch_spec, state)
        started = time.monotonic()
        try:
            self._launch_and_wait(launch, state, report, started)
        finally:
            self._collect(launch, service, state, report, started, timeline_path)
        return [_load_result(r, blob) for r, blob in enumerate(state.results())]

    def _place(self, state: JobState, secret: bytes, cluster) -> DriverService:
        """Check the cluster can hold the job; start the job's service where the
        executors (or the local ranks) reach it."""
        if cluster is not None:
            opts = self.options
            cluster.check_slots(state.job.num_ranks, opts.ranks_per_task, opts.start_timeout)
            bind_host, advertise_host = cluster.driver_addresses()
        else:
            bind_host = advertise_host = LOCAL_HOST
        return DriverService(state, secret, bind_host, advertise_host)

    def _launch_spec(
        self,
        state: JobState,
        service: DriverService,
        secret: bytes,
        attempt: int,
        report: JobReport,
        relay: bool,
        timeline_path: str | None,
    ) -> LaunchSpec:
        """What every task needs to start its part of this attempt."""
        opts = self.options
        rank_env = {
            **tracking.rank_environment(),
            **opts.env,
            job_environment.ATTEMPT: str(attempt),
        }
        if timeline_path:
            rank_env[job_environment.HOROVOD_TIMELINE] = timeline_path
        plan = RelayPlan(
            job=state.job,
            start_timeout=opts.start_timeout,
            timeout=opts.timeout,
            launcher_expected=report.launcher == "mpi",
            checkpoint_dir=opts.checkpoint_dir,
        )
        job = JobEnvironment(
            job_id=state.job.job_id,
            driver=join_address(*service.address),
            secret=secret,
            log_mode=opts.driver_log_verbosity,
            launcher=report.launcher,
        )
        return LaunchSpec(
            job=job,
            num_ranks=state.job.num_ranks,
            env=rank_env,
            mpi_args=opts.mpi_args,
            network_interface=opts.network_interface,
            driver_path=os.environ.get("PATH", ""),
            driver_pythonpath=driver_pythonpath(),
            relay=plan if relay else None,
            ranks_per_task=opts.ranks_per_task,
        )

    def _launch_and_wait(
        self, launch: Launch, state: JobState, report: JobReport, started: float
    ) -> None:
        """Start the job and wait for its end; tell its processes to finish or abort."""
        opts = self.options
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
            report.outcome = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            state.stop("abort", f"job {report.outcome}: {type(exc).__name__}")
            raise

    def _collect(
        self,
        launch: Launch,
        service: DriverService,
        state: JobState,
        report: JobReport,
        started: float,
        timeline_path: str | None,
    ) -> None:
        """Stop what the job started, and record what it did (report, MLflow, timeline)."""
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
        job_id = report.job_id
        if leftovers:
            logger.warning("processes of job %s still alive after stop: %s", job_id, leftovers)
        logger.info("sparkdist job %s %s in %.1fs", job_id, report.outcome, report.wall_time_s)


def _resume_point(checkpoints: CheckpointStore | None, directory: str | None) -> str:
    if checkpoints is None:
        return f"from the newest checkpoint in {directory}"
    steps = checkpoints.steps()
    return (
        f"from the checkpoint of step {steps[-1]}"
        if steps
        else "from scratch (no checkpoint saved yet)"
    )


def _convert_dataframes(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Spark DataFrame arguments become converter handles that each rank opens on its
    own shard (`sparkdist.data`): the data goes to Parquet once, not into the payload."""
    if "pyspark" not in sys.modules:
        return kwargs
    from pyspark.sql import DataFrame

    frames = {k for k, v in kwargs.items() if isinstance(v, DataFrame)}
    if not frames:
        return kwargs
    from sparkdist.data import make_spark_converter

    converted = dict(kwargs)
    for key in frames:
        converted[key] = make_spark_converter(kwargs[key])
        logger.info("DataFrame argument %r arrives in the ranks as a converter handle", key)
    return converted


def driver_pythonpath() -> str:
    """The driver's own import path (PYTHONPATH and sys.path), minus its Python
    installation, so ranks can import the driver's modules (a function defined in a
    module is pickled by reference) without shadowing the executors' packages."""
    install = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep) + sys.path
    keep = []
    for entry in entries:
        real = os.path.realpath(entry or os.getcwd())
        if any(real == p or real.startswith(p + os.sep) for p in install):
            continue
        if "site-packages" in real or "dist-packages" in real or not os.path.isdir(real):
            continue
        if real not in keep:
            keep.append(real)
    return os.pathsep.join(keep)


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
