"""How the end of a rank, a Spark task or the launcher becomes the job's failure.

A rank that raised, exited non-zero or lost its supervisor fails the job, and so do a
lost task and a launcher that exited non-zero; each is noticed by the job's
`failures.FailureTracker`, which picks the one that explains the job's failure. A
parameter-server worker that ends without an error of its own is a loss the job
survives while another worker is left (its coordinator reschedules the worker's steps).
"""

from __future__ import annotations

import logging
import signal
from typing import Protocol

from sparkdist.errors import describe_exit
from sparkdist.runner.driver.state.launcher import LauncherRecord
from sparkdist.runner.driver.state.ranks import RankRecords
from sparkdist.runner.driver.state.spec import JobSpec
from sparkdist.runner.driver.state.tasks import SparkTasks

logger = logging.getLogger(__name__)


class Notice(Protocol):
    """`FailureTracker.notice`: remember a failure."""

    def __call__(
        self,
        rank: int | None,
        reason: str | None,
        outside_user_code: bool = False,
        task_raised: bool = False,
    ) -> None: ...


class Losses:
    """Decides which ends fail the job, and tells the failure tracker (`notice`)."""

    def __init__(
        self,
        job: JobSpec,
        ranks: RankRecords,
        tasks: SparkTasks,
        launcher: LauncherRecord,
        notice: Notice,
    ):
        self._job = job
        self._ranks = ranks
        self._tasks = tasks
        self._launcher = launcher
        self._notice = notice
        self.workers_lost: set[int] = set()
        """Parameter-server workers the job went on without."""

    def task_lost(self, index: int, host: str) -> None:
        """A task's connection broke before it said it was done."""
        first = index * self._job.ranks_per_task  # the task's first rank
        rank = first if first in self._ranks.by_rank else None
        reason = (
            f"lost contact with Spark task {index} on host {host}: its "
            "executor died, or the host or its network was lost"
        )
        with self._ranks.cond:
            self._tasks.lost_contact(index, reason)
            if rank is not None and self._ranks.by_rank[rank].host == "?":
                self._ranks.by_rank[rank].host = host
        self._notice(rank, reason, outside_user_code=True)

    def supervisor_lost(self, rank: int) -> None:
        """A rank's supervisor's connection broke before it reported the rank's exit."""
        with self._ranks.cond:
            exited = self._ranks.by_rank[rank].exited
        if exited:
            return
        if self._job.tolerates_loss(rank):
            self.worker_lost(rank, None)
            return
        self._notice(
            rank,
            f"lost contact with rank {rank} (its supervisor process died, or its host "
            "or network was lost)",
        )

    def rank_error(self, rank: int, traceback: str, reason: str) -> None:
        """The rank's function raised."""
        self._ranks.error(rank, traceback)
        self._notice(rank, reason)

    def rank_exited(self, rank: int, exit_code: int, tail: list[str]) -> None:
        self._ranks.exited(rank, exit_code, tail)
        if exit_code == 0:
            return
        raised = self._ranks.by_rank[rank].traceback is not None
        if self._job.tolerates_loss(rank) and not raised:
            self.worker_lost(rank, exit_code)
        else:
            killed = exit_code == -signal.SIGKILL and not raised
            self._notice(rank, None, outside_user_code=killed)

    def worker_lost(self, rank: int, exit_code: int | None) -> None:
        """A parameter-server worker ended without an error of its own (killed, its host
        lost): the job goes on while another worker is left."""
        workers = self._job.roles.ranks_of("worker")
        with self._ranks.cond:
            self.workers_lost.add(rank)
            left = len(workers) - len(self.workers_lost)
        how = f"ended with {describe_exit(exit_code)}"
        if left > 0:
            logger.warning(
                "sparkdist job %s: worker rank %d %s; the chief's coordinator runs its steps "
                "on the %d worker(s) left", self._job.job_id, rank, how, left,
            )  # fmt: skip
            return
        self._notice(
            rank,
            f"every worker of the parameter-server job was lost (the last, rank {rank}, {how})",
            outside_user_code=True,
        )

    def launcher_exited(self, name: str, exit_code: int) -> None:
        """mpirun (or a direct launcher's supervisor process) ended."""
        self._launcher.exited(name, exit_code)
        if exit_code != 0:
            self._notice(None, f"{name} exited with code {exit_code}")

    def fail(self, reason: str, task_raised: bool = False) -> None:
        """A failure seen outside the ranks (e.g. the Spark stage itself failed; with
        `task_raised`, because a task's own code raised)."""
        self._notice(None, reason, task_raised=task_raised)
