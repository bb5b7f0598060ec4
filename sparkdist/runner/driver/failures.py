"""Which failure explains a job, when to report it, and whether it was the training
code's doing (a retry decision).

Failures arrive from every side at about the same time: a rank's traceback, its
supervisor's exit status, a lost Spark task, mpirun's exit. The first one is kept,
except that a rank's own failure noticed within `FAILURE_SETTLE_S` replaces a failure
outside any rank (it explains a lost task or mpirun's exit better). The tracker also
owns the driver's wait for the job: success, the first failure, or a time limit.
Which ends are failures at all is decided before (`state/losses.py`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sparkdist import errors
from sparkdist.runner.driver.state.growth import Growth
from sparkdist.runner.driver.state.launcher import LauncherRecord
from sparkdist.runner.driver.state.ranks import RankRecords
from sparkdist.runner.driver.state.tasks import SparkTasks

# After a rank reports an exception, how long to wait for its exit status and last
# output lines before reporting the failure anyway.
FAILURE_SETTLE_S = 3.0


class WorldResize(Exception):
    """Not a failure: an elastic job's rank 0 stopped at a checkpoint so that the job
    can relaunch with more ranks (`runner/driver/launch/elastic.py`)."""


@dataclass
class Failure:
    rank: int | None
    reason: str | None
    noticed_at: float
    outside_user_code: bool = False
    """Lost executor or host, or a rank killed by SIGKILL: not the training code's doing."""
    task_raised: bool = False
    """The Spark stage failed because a task's own code raised (e.g. a missing network
    interface): the cause of the task losses Spark's cancelling then brings."""


class FailureTracker:
    """The failures of one job, and the driver's wait for it. Reads the job's ranks,
    tasks, launcher and growth under the job's lock (`cond`); `succeeded` says whether
    the job is done."""

    def __init__(
        self,
        cond: threading.Condition,
        ranks: RankRecords,
        tasks: SparkTasks,
        launcher: LauncherRecord,
        growth: Growth,
        succeeded: Callable[[], bool],
    ):
        self._cond = cond
        self._ranks = ranks
        self._tasks = tasks
        self._launcher = launcher
        self._growth = growth
        self._succeeded = succeeded
        self._first: Failure | None = None
        self._noticed: list[Failure] = []
        self._stopping: str | None = None

    @property
    def stopping(self) -> str | None:
        """Why the job is being stopped on purpose, or None."""
        return self._stopping

    def stop(self, reason: str) -> None:
        """The job is being aborted: later losses are expected, not failures."""
        with self._cond:
            self._stopping = reason

    def notice(
        self,
        rank: int | None,
        reason: str | None,
        outside_user_code: bool = False,
        task_raised: bool = False,
    ) -> None:
        """Remember a failure; the first one (see above) explains the job's."""
        with self._cond:
            if self._stopping and self._first is None:
                return  # the job is being stopped on purpose: losses are expected
            now = time.monotonic()
            failure = Failure(rank, reason, now, outside_user_code, task_raised)
            if not self._stopping:
                self._noticed.append(failure)
            first = self._first
            if first is None or (
                now - first.noticed_at < FAILURE_SETTLE_S
                and _explains_better(failure, first, stopping=self._stopping is not None)
            ):
                self._first = failure
            self._cond.notify_all()

    def note_outside(self, reason: str) -> None:
        """A failure outside the training code that was seen elsewhere (a relayed job's
        task 0), so that `outside_user_code` reports it here too."""
        with self._cond:
            self._noticed.append(Failure(None, reason, time.monotonic(), True))

    def outside_user_code(self) -> str | None:
        """Why the job's failure was not the training code's doing, or None.

        Looks at every failure noticed until the job was stopped, because the first one
        reported can be a consequence: when a rank is killed, its peers' collectives
        raise at about the same moment as its death is reported. A Spark task lost at any
        time (its executor or host gone) counts, and so does a rank that died of a signal
        without raising when it was the first failure. Call it after the job stopped.
        """
        with self._cond:
            if self._first is not None and self._first.task_raised:
                return None
            for failure in self._noticed:
                if failure.outside_user_code:
                    return self._describe(failure)
            lost = self._tasks.lost
            if lost:
                # Noticed only while the job was being stopped (a host cut off is
                # noticed when its connections time out, later than its peers' errors).
                index = min(lost)
                return self._describe(Failure(index, lost[index], 0.0))
            first = self._first
            if first is not None and first.rank is not None:
                state = self._ranks.by_rank[first.rank]
                code = state.exit_code
                if state.traceback is None and code is not None and code < 0:
                    return self._describe(first)
            return None

    def _describe(self, failure: Failure) -> str:
        if failure.rank is None:
            return failure.reason or "unknown"
        state = self._ranks.by_rank[failure.rank]
        if failure.reason:
            return f"rank {failure.rank} on host {state.host}: {failure.reason}"
        return (
            f"rank {failure.rank} on host {state.host} ended with "
            f"{errors.describe_exit(state.exit_code)}"
        )

    def _ready(self) -> bool:
        """Whether the first failure can be reported: its rank's exit status (and so its
        last lines) arrived, or it settled."""
        failure = self._first
        if failure is None:
            return False
        settled = time.monotonic() - failure.noticed_at >= FAILURE_SETTLE_S
        if failure.rank is None:
            return settled
        return self._ranks.by_rank[failure.rank].exited or settled

    def wait(
        self, start_deadline: float | None, deadline: float | None, launcher_expected: bool
    ) -> None:
        """Block until the job succeeded, failed, or ran out of time; raise on the latter
        two."""
        ranks = self._ranks
        with self._cond:
            while True:
                if self._growth.resizing is not None and ranks.by_rank[0].exited:
                    raise WorldResize(self._growth.resizing)
                if self._ready():
                    raise self._error()
                launcher_done = not launcher_expected or self._launcher.exit_code == 0
                if self._succeeded() and launcher_done:
                    return
                now = time.monotonic()
                if start_deadline and now > start_deadline and not ranks.all_started():
                    missing = ranks.not_started()
                    raise errors.start_timeout_error(
                        missing, len(ranks.by_rank), sorted(self._tasks.started),
                        ranks.tails(missing),
                    )  # fmt: skip
                if deadline and now > deadline:
                    running = ranks.running()
                    raise errors.timeout_error(running, ranks.tails(running))
                self._cond.wait(0.2)

    def _error(self) -> errors.JobFailedError:
        failure = self._first
        assert failure is not None
        if failure.rank is None:
            tail = list(self._launcher.tail)
            return errors.JobFailedError(failure.reason or "unknown", tail)
        state = self._ranks.by_rank[failure.rank]
        reason = failure.reason
        if state.traceback is None and failure.rank in self._tasks.lost:
            # The rank's task was lost too: its executor (or host) is the better explanation.
            reason = self._tasks.lost[failure.rank]
        return errors.rank_failed_error(
            state.rank, state.host, state.exit_code, state.traceback, list(state.tail), reason
        )


def _explains_better(new: Failure, first: Failure, stopping: bool) -> bool:
    """Whether a failure noticed soon after the first one explains the job's better.

    A rank's failure explains more than one without a rank (mpirun's exit, the Spark stage
    failing). But a task that raised, before the job was being stopped, is the cause of the
    losses that follow: Spark cancels the other tasks, whose connections then break, in
    either order.
    """
    if new.task_raised:
        return first.outside_user_code and not stopping
    if first.task_raised:
        return False
    return first.rank is None and new.rank is not None
