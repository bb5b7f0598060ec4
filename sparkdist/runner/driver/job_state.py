"""What the driver knows about a running job, as its peers' messages build it up.
Shared by the driver's handler threads under one lock (`cond`).

`JobState` composes one part per concern (`state/`): each rank's record
(`rank_records`), the Spark tasks (`tasks`), the launcher (`launcher`), the open
channels (`peers`), a parameter-server job's servers (`servers`), which ends fail the
job (`losses`) and an elastic job's growth (`growth`); plus the failures
(`failures.FailureTracker`, which also owns the wait for the job), the rendezvous store
(`rendezvous`), and where rank output is printed (`console`). `service` turns messages
into calls on it and on its parts; its own methods are the events that touch several
parts, the `launch.LauncherSink` a launch on the driver reports to, and what the
launchers read.
"""

from __future__ import annotations

import threading

from sparkdist.protocol import messages, wire
from sparkdist.protocol.processes import ProcessRecord
from sparkdist.runner.driver.checkpoint_store import CheckpointStore
from sparkdist.runner.driver.console import Console
from sparkdist.runner.driver.failures import FailureTracker
from sparkdist.runner.driver.metrics import ReportedMetrics
from sparkdist.runner.driver.rendezvous import RendezvousStore
from sparkdist.runner.driver.state import peers
from sparkdist.runner.driver.state.growth import Growth
from sparkdist.runner.driver.state.launcher import LauncherRecord
from sparkdist.runner.driver.state.losses import Losses
from sparkdist.runner.driver.state.peers import Peers
from sparkdist.runner.driver.state.ranks import RankRecords, RankState
from sparkdist.runner.driver.state.servers import ParameterServers
from sparkdist.runner.driver.state.spec import JobSpec
from sparkdist.runner.driver.state.tasks import SparkTasks

__all__ = ["JobSpec", "JobState", "RankState"]


class JobState:
    """Everything the driver knows about a running job; safe across handler threads."""

    def __init__(
        self,
        job: JobSpec,
        console: Console | None = None,
        checkpoints: CheckpointStore | None = None,
        metrics: ReportedMetrics | None = None,
    ):
        self.job = job
        self.console = console or Console()
        self.checkpoints = checkpoints
        self.metrics = metrics or ReportedMetrics()
        """Where the ranks' `sparkdist.report` calls go."""
        self.cond = threading.Condition()
        self.processes: list[ProcessRecord] = []
        self.files: dict[str, bytes] = {}
        self.rendezvous = RendezvousStore()
        cond = self.cond
        self.rank_records = RankRecords(job.num_ranks, cond, self.console, job.log_mode)
        self.ranks: dict[int, RankState] = self.rank_records.by_rank
        """Each rank's record (the same dict as `rank_records.by_rank`)."""
        self.tasks = SparkTasks(job.num_tasks, cond)
        self.launcher = LauncherRecord(cond)
        self.growth = Growth(cond)
        self.peers = Peers(cond)
        self.servers = ParameterServers(job, self.rank_records, self.peers)
        self.failures = FailureTracker(
            cond, self.rank_records, self.tasks, self.launcher, self.growth, self.succeeded
        )
        self.losses = Losses(
            job, self.rank_records, self.tasks, self.launcher, self.failures.notice
        )

    @property
    def frameworks(self) -> list[str]:
        """The frameworks rank 0's function used."""
        return self.rank_records.frameworks

    @frameworks.setter
    def frameworks(self, value: list[str]) -> None:
        self.rank_records.frameworks = value

    @property
    def tasks_started(self) -> set[int]:
        return self.tasks.started

    # --- events that touch several parts ----------------------------------------------

    def connected(self, kind: str, number: int, channel: wire.Channel) -> str | None:
        """A task or supervisor connected; returns why the job is stopping, if it is
        (the peer is then told to abort at once)."""
        with self.cond:
            self.peers.add(kind, number, channel)
            if kind == "task":
                self.tasks.connected(number)
            late_server = self.servers.late(kind, number)
        if late_server:
            self.servers.finish([channel])
        return self.failures.stopping

    def stop(self, how: str, reason: str) -> None:
        """Tell every task to finish (`how="finish"`), or every task and supervisor to
        abort (`how="abort"`)."""
        if how == "abort":
            self.failures.stop(reason)
            self.rendezvous.close()
        order = messages.Abort(reason) if how == "abort" else messages.Finish(reason)
        peers.send(self.peers.select(lambda kind, _: kind == "task" or how == "abort"), order)

    def agent_placed(self, index: int, place: messages.AgentPlace) -> None:
        """Task `index`'s agent listens at `place`; once every task's does, task 0 gets
        them all and starts mpirun over them (task 0 gone: its loss fails the job)."""
        with self.cond:
            places = self.tasks.placed(index, place)
            task0 = self.peers.channel("task", 0)
        if places is not None and task0 is not None:
            peers.send([task0], messages.AgentPlaces(places))

    def rank_result(self, rank: int, value: bytes, frameworks: list[str]) -> None:
        """A rank's function returned; the chief's return stops a job's servers."""
        with self.cond:
            self.rank_records.result(rank, value, frameworks)
            servers = self.servers.channels()
        if servers and self.servers.chief_done():
            self.servers.finish(servers)

    def answer_checkpoint(self, rank: int, step: int) -> str | None:
        """After rank `rank` stored checkpoint `step`: "grow" when the job should stop
        there to grow (rank 0 then ends; later losses are no failures), else None."""
        with self.cond:
            answer = self.growth.answer_checkpoint(rank, step)
            if answer == "grow":
                self.failures.stop("growing")
        return answer

    # --- the `launch.LauncherSink` of a launch on the driver (and of task 0's reports) ---

    def record(self, record: ProcessRecord) -> None:
        with self.cond:
            if record not in self.processes:
                self.processes.append(record)

    def launcher_output(self, lines: list[str]) -> None:
        self.launcher.output(lines)

    def launcher_exited(self, name: str, exit_code: int) -> None:
        """mpirun (or a direct launcher's supervisor process) ended."""
        self.losses.launcher_exited(name, exit_code)

    # --- what the launchers call ------------------------------------------------------

    def task_lost(self, index: int, host: str) -> None:
        """A task's connection broke before it said it was done."""
        self.losses.task_lost(index, host)

    def fail(self, reason: str, task_raised: bool = False) -> None:
        """A failure seen outside the ranks (see `Losses.fail`)."""
        self.losses.fail(reason, task_raised)

    def request_grow(self, reason: str) -> None:
        """Ask rank 0 to stop at its next checkpoint, so the job relaunches larger."""
        self.growth.request(reason)

    def succeeded(self) -> bool:
        """Every rank ended well (or was a worker the job could lose), the results the
        job waits for arrived, and mpirun, if any, exited with 0."""
        needed = self.ranks if self.job.all_results else [0]
        needed = [r for r in needed if self.servers.needs_result(r)]
        with self.cond:
            ended = self.rank_records.succeeded(needed, tolerated=self.losses.workers_lost)
            return ended and self.launcher.exit_code in (None, 0)

    def started_processes(self) -> list[ProcessRecord]:
        """Every process the job reported starting, so far."""
        with self.cond:
            return list(self.processes)

    def live_task_count(self) -> int:
        """How many Spark tasks connected and were not lost: those whose end to await."""
        return self.tasks.live_count()

    def results(self) -> list[bytes | None]:
        return self.rank_records.results()

    def wait_tasks_done(self, count: int, timeout_s: float) -> bool:
        return self.tasks.wait_done(count, timeout_s)
