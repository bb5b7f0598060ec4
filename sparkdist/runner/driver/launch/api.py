"""The launch seam: how one attempt of a job forms its world, whatever the kind.

`job.run_job` drives every job through one loop of attempts. Each attempt asks the job's
`LaunchKind` to *form* the world (its ranks, its `JobState`, its service, its
`protocol.launch.Launch`), then starts it, waits for it, stops it and collects what it
did, the same way for every kind. The kinds (`job.choose_kind` picks one per job):

* `local.DriverLocalKind`: np < 0, the ranks are subprocesses of the driver;
* `barrier.BarrierKind`: one Spark barrier stage, served from the driver;
* `relayed.RelayedKind`: a barrier stage whose task 0 serves the job, for a Spark
  Connect client the executors cannot reach;
* `gang_kind.GangKind`: plain Spark tasks that check in with a gang; the world is formed
  from those that run (min_np..max_np) and grows or shrinks between attempts.

As in torch.distributed.elastic, a failure and a membership change are both a relaunch
of the loop: a failure is counted by the `failures.RelaunchBudget`, a resize is not.
An in-process elastic world (`sparkdist.elastic.run` under the direct launcher) changes
without a relaunch: the loop asks the kind to re-form it (`change_in_process`).
The job's one checkpoint store travels in every `AttemptPlan` to the attempt's state,
whose service hands it the ranks' checkpoint messages.

What a job is and how it ended (`RunnerOptions`, `JobSpec`, `Outcome`, `JobReport`) are
`runner/driver/job_spec.py`'s, beside this package: the job state's modules, which this
one imports, use `JobSpec` too.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Protocol

from sparkdist import job_environment, tracking
from sparkdist.checkpoint.driver.store import CheckpointStore, NoStore
from sparkdist.job_environment import JobEnvironment
from sparkdist.protocol import messages, wire
from sparkdist.protocol.launch import Launch, LaunchSpec
from sparkdist.protocol.payload import driver_pythonpath
from sparkdist.runner.driver.console import Console
from sparkdist.runner.driver.failures import Relaunch, RelaunchBudget, WorldChange
from sparkdist.runner.driver.job_spec import JobSpec, RunnerOptions
from sparkdist.runner.driver.job_state import JobState
from sparkdist.runner.driver.metrics import ReportedMetrics
from sparkdist.runner.driver.rank_logs import RunLogs
from sparkdist.spark import jobs
from sparkdist.trace.recorder import JobTrace

logger = logging.getLogger(__name__)


class Closeable(Protocol):
    def close(self) -> None: ...


@dataclass
class World:
    """A formed world: the attempt's state, the service its processes report to, and
    how its processes are started, awaited and stopped."""

    state: JobState
    service: Closeable
    launch: Launch
    started: float = field(default_factory=time.monotonic)
    """When the attempt's clock started: `start_timeout` and its wall time count from
    here (an elastic world's, from before its gang formed)."""


@dataclass
class AttemptPlan:
    """What every kind needs to form one attempt's world: its identity and secret, the
    job's checkpoint store, and how the job's specs, states and Spark descriptions are
    made."""

    options: RunnerOptions
    number: int
    """0 for the first attempt, 1 after the first relaunch..."""
    job_id: str
    secret: wire.JobSecret
    timeline_path: str | None
    name: str
    launcher: str
    blob: bytes
    all_results: bool
    metrics: ReportedMetrics
    credentials: messages.SecretEnv
    checkpoints: CheckpointStore | NoStore
    """The job's one store, opened before its first attempt (`job.run_job`)."""
    rank_logs: RunLogs = field(default_factory=RunLogs)
    """Where the run's per-rank files go: a directory per attempt (`rank_logs.py`)."""
    warm: object | None = None
    """A warm world's `warm.WarmDispatch` (its ranks run one payload after another)."""
    trace: JobTrace = field(default_factory=JobTrace)
    """The job's trace, kept across its attempts (`sparkdist/trace/recorder.py`)."""

    def new_state(self, num_ranks: int, in_process_min_np: int | None = None) -> JobState:
        """The state of this attempt's world of `num_ranks` ranks (an in-process elastic
        world's: re-formed in process down to `in_process_min_np` ranks)."""
        opts = self.options
        job = JobSpec(
            self.job_id,
            num_ranks,
            self.blob,
            self.all_results,
            opts.driver_log_verbosity,
            opts.ranks_per_task,
            opts.roles,
            rank0_env=self.credentials,
            in_process_min_np=in_process_min_np,
        )
        console = Console(files=self.rank_logs.attempt(self.number, self.job_id))
        state = JobState(
            job,
            console=console,
            checkpoints=self.checkpoints,
            metrics=self.metrics,
            trace=self.trace,
        )
        if self.warm is not None:
            state.warm = self.warm
            self.warm.attach(state, self.secret, self.number)
        return state

    def spec(self, num_ranks: int, driver: str, relay=None) -> LaunchSpec:
        """What every task needs to start its part of this attempt."""
        opts = self.options
        rank_env = {
            **tracking.rank_environment(),
            **opts.env,
            job_environment.ATTEMPT: str(self.number),
        }
        if self.timeline_path:
            rank_env[job_environment.HOROVOD_TIMELINE] = self.timeline_path
        if opts.roles is not None:
            rank_env.update(opts.roles.to_env())
        job = JobEnvironment(
            job_id=self.job_id,
            driver=driver,
            secret=self.secret,
            log_mode=opts.driver_log_verbosity,
            launcher=self.launcher,
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

    def description(self, num_ranks: int, kind: str) -> str:
        """What the attempt's Spark job is called in the Spark UI."""
        if self.warm is not None:
            kind = f"{kind}, kept warm (keep_warm={self.options.keep_warm:g}s)"
        return (
            f"sparkdist {self.name}: {num_ranks} ranks, {kind}, attempt {self.number + 1} "
            f"(job {self.job_id}){jobs.purpose_suffix()}"
        )


class LaunchKind(Protocol):
    """One way a job's world is formed and launched (see the module's docstring)."""

    def form(self, plan: AttemptPlan, why: str) -> World:
        """Form this attempt's world; `why` says why it is launched ("start", or the
        previous attempt's failure or resize). Raises if no world can form: that ends
        the job."""

    def relaunching(
        self, job_id: str, relaunch: Relaunch, budget: RelaunchBudget, resume_point: str
    ) -> str:
        """Note that attempt `job_id` failed and is launched again, resuming from
        `resume_point` (the checkpoint store's); return the `why` of the next attempt."""

    def change_in_process(self, world: World, change: WorldChange) -> bool:
        """Re-form `world` in process as the loop decided: go on without its lost
        members, or seat the tasks standing by (`change.grow`). False if nothing changed
        (no task stood by any more)."""


class FixedSizeKind:
    """What the fixed-size kinds (driver-local, barrier, relayed) share: a world of `np`
    ranks every attempt, and the relaunch line in the driver's log."""

    def __init__(self, options: RunnerOptions):
        self.options = options

    def change_in_process(self, world: World, change: WorldChange) -> bool:
        raise AssertionError(f"a fixed-size world does not change in process: {change}")

    def relaunching(
        self, job_id: str, relaunch: Relaunch, budget: RelaunchBudget, resume_point: str
    ) -> str:
        if not relaunch.counted:
            logger.warning(
                "sparkdist job %s: mpirun could not start its daemons before any rank "
                "started; launching it once more. Open MPI said:\n%s",
                job_id,
                "\n".join(relaunch.output_tail),
            )
            return relaunch.reason
        logger.warning(
            "sparkdist job %s failed (%s); relaunching it (relaunch %d of at most %d), "
            "resuming from %s",
            job_id,
            relaunch.reason,
            budget.used,
            budget.max_failures,
            resume_point,
        )
        return relaunch.reason
