"""`HorovodRunner`: the public entry point of the runner path.

    HorovodRunner(np=2).run(main, lr=0.1)

pickles `main` and its arguments here, on the driver, runs `main(**kwargs)` on every
rank, and returns rank 0's value. See DESIGN.md for the data flow.
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

from sparkdist import tracking
from sparkdist.backends import timeline
from sparkdist.checkpoint import ATTEMPT_ENV
from sparkdist.runner import payload, retry, wire
from sparkdist.runner.checkpoint_store import CheckpointStore
from sparkdist.runner.driver import DriverService, JobSpec, JobState
from sparkdist.runner.errors import SparkdistError
from sparkdist.runner.launch import LaunchSpec, mpirun_available
from sparkdist.runner.local_launch import LOCAL_HOST, LocalLaunch
from sparkdist.runner.processes import ProcessRecord
from sparkdist.runner.relay import RelayPlan
from sparkdist.runner.script import ScriptMain
from sparkdist.runner.spark_cluster import BarrierStage, RelayedStage, active_spark

logger = logging.getLogger(__name__)

LOG_MODES = ("all", "log_callback_only")
LAUNCHERS = ("auto", "mpi", "direct")


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
        np: number of ranks. `np > 0`: one Spark barrier task per rank on the cluster.
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
    ):
        if isinstance(np, bool) or not isinstance(np, int):
            raise ValueError(f"np must be an int, got {np!r}")
        if np == 0:
            raise ValueError(
                "np must not be 0: use np > 0 for that many ranks on the cluster, or np < 0 "
                "for -np ranks on the driver"
            )
        if driver_log_verbosity not in LOG_MODES:
            raise ValueError(
                f"driver_log_verbosity must be one of {LOG_MODES}, got {driver_log_verbosity!r}"
            )
        if launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")
        if launcher == "mpi" and not mpirun_available():
            raise ValueError(
                "launcher='mpi' needs Open MPI's mpirun on PATH: install it (e.g. "
                "`bash init_scripts/install_system.sh`) or use launcher='direct'"
            )
        for name, value in (("start_timeout", start_timeout), ("timeout", timeout)):
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        env = dict(env or {})
        bad = [k for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise ValueError(f"env must map str to str; bad entries: {bad}")
        if isinstance(mpi_args, str) or not all(isinstance(a, str) for a in mpi_args):
            raise ValueError(
                "mpi_args must be a list of strings, e.g. ['--mca', 'btl_tcp_links', '2']"
            )
        if isinstance(max_failures, bool) or not isinstance(max_failures, int) or max_failures < 0:
            raise ValueError(
                f"max_failures must be an int >= 0 (relaunches allowed), got {max_failures!r}"
            )
        self.np = np
        self.max_failures = max_failures
        self.retry_on_exception = bool(retry_on_exception)
        self.checkpoint_dir = os.fspath(checkpoint_dir) if checkpoint_dir is not None else None
        self.driver_log_verbosity = driver_log_verbosity
        self.launcher = launcher
        self.start_timeout = float(start_timeout)
        self.timeout = timeout
        self.env = env
        self.mpi_args = list(mpi_args)
        self.network_interface = network_interface
        self.timeline = os.fspath(timeline) if timeline is not None else None
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

    def _resolved_launcher(self) -> str:
        if self.launcher != "auto":
            return self.launcher
        return "mpi" if mpirun_available() else "direct"

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
        launcher = self._resolved_launcher()
        report = JobReport(job_id="", np=self.np, launcher=launcher)
        self.last_job = report
        cluster = None if self.np < 0 else active_spark()
        relay = cluster is not None and not cluster.executors_reach_client()
        if relay:
            self._check_relay()
        # Relayed, checkpoints live where task 0 can write them (checkpoint_dir), not here.
        checkpoints = CheckpointStore(self.checkpoint_dir) if not relay else None
        try:
            attempt = 0
            while True:
                state = JobState(
                    JobSpec(uuid.uuid4().hex[:12], abs(self.np), blob, all_results,
                            self.driver_log_verbosity),
                    checkpoints=checkpoints,
                )  # fmt: skip
                report.attempts = attempt + 1
                try:
                    return self._attempt(state, report, attempt, cluster, relay)
                except BaseException as exc:
                    reason = retry.retry_reason(exc, state, self.retry_on_exception)
                    if reason is None or attempt >= self.max_failures:
                        raise
                    attempt += 1
                    report.failures.append(reason)
                    logger.warning(
                        "sparkdist job %s failed (%s); relaunching it (relaunch %d of at most "
                        "%d), %s", state.spec.job_id, reason, attempt, self.max_failures,
                        _resume_point(checkpoints, self.checkpoint_dir),
                    )  # fmt: skip
        finally:
            if checkpoints is not None:
                checkpoints.close()

    def _check_relay(self) -> None:
        """Relay mode (executors cannot reach this client): say so once, and require
        storage that outlives barrier task 0 when a relaunch must resume from it."""
        if self.max_failures and self.checkpoint_dir is None:
            raise SparkdistError(
                "the executors cannot reach this Spark Connect client, so the job's service "
                "runs in barrier task 0, and relaunches (max_failures="
                f"{self.max_failures}) resume from checkpoints that must outlive that task: "
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
        """Launch the job once; return every rank's (unpickled) result."""
        job_id, np, launcher = state.spec.job_id, state.spec.np, report.launcher
        report.job_id = job_id
        report.outcome = "running"
        secret = wire.new_secret()

        if cluster is not None:
            cluster.check_slots(np, self.start_timeout)
            bind_host, advertise_host = cluster.driver_addresses()
        else:
            bind_host = advertise_host = LOCAL_HOST
        service = DriverService(state, secret, bind_host, advertise_host)
        timeline_path = timeline.requested_path(self.timeline, os.environ)
        rank_env = {**tracking.rank_environment(), **self.env, ATTEMPT_ENV: str(attempt)}
        if timeline_path:
            rank_env[timeline.TIMELINE_ENV] = timeline_path
        spec = LaunchSpec(
            job_id=job_id,
            driver=f"{service.address[0]}:{service.address[1]}",
            secret=secret,
            np=np,
            launcher=launcher,
            log_mode=self.driver_log_verbosity,
            env=rank_env,
            mpi_args=tuple(self.mpi_args),
            network_interface=self.network_interface,
            driver_path=os.environ.get("PATH", ""),
            driver_pythonpath=driver_pythonpath(),
            relay=RelayPlan(
                job=state.spec,
                start_timeout=self.start_timeout,
                timeout=self.timeout,
                launcher_expected=launcher == "mpi",
                checkpoint_dir=self.checkpoint_dir,
            )
            if relay
            else None,
        )
        logger.info(
            "sparkdist job %s: %d ranks, launcher %s, %s",
            job_id, np, launcher, "on the driver" if cluster is None else "on the cluster",
        )  # fmt: skip
        started = time.monotonic()
        if cluster is None:
            launch = LocalLaunch(spec, state)
        else:
            launch = (RelayedStage if relay else BarrierStage)(cluster, spec, state)
        try:
            launch.start()
            launch.wait(
                start_deadline=started + self.start_timeout,
                deadline=started + self.timeout if self.timeout else None,
                launcher_expected=launcher == "mpi",
            )
            state.stop("finish", "done")
            report.outcome = "succeeded"
        except BaseException as exc:
            report.outcome = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            state.stop("abort", f"job {report.outcome}: {type(exc).__name__}")
            raise
        finally:
            leftovers = launch.stop(finished=report.outcome == "succeeded")
            service.close()
            report.wall_time_s = time.monotonic() - started
            report.processes += [p for p in state.processes if p not in report.processes]
            report.files = dict(state.files)
            report.frameworks = list(state.frameworks)
            tracking.log_job(
                np=self.np,
                launcher=launcher,
                backend=",".join(report.frameworks) or "none",
                wall_time_s=report.wall_time_s,
                outcome=report.outcome,
            )
            try:
                timeline.save_timeline(report.files, timeline_path)
            except OSError as exc:
                logger.warning("could not write the Horovod timeline to %s: %s", timeline_path, exc)
            if leftovers:
                logger.warning("processes of job %s still alive after stop: %s", job_id, leftovers)
            logger.info("sparkdist job %s %s in %.1fs", job_id, report.outcome, report.wall_time_s)
        return [_load_result(r, blob) for r, blob in enumerate(state.results())]


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
