"""A job's failures, from the end of one of its processes to the failure that explains
the job, and whether that failure is one to relaunch after.

1. **Which ends fail the job** (`Losses`). A rank that raised, exited non-zero or lost
   its supervisor fails the job, and so do a lost task and a launcher that exited
   non-zero. A parameter-server worker that ends without an error of its own is a loss
   the job survives while another worker is left (its coordinator reschedules the
   worker's steps). A rank lost without an error of its own from an in-process elastic
   world whose every rank entered elastic code is no failure yet: `membership.py` keeps
   it for the loop of attempts, which re-forms the world without it, or `refused` it
   (then it fails the job as ever).
2. **Which failure explains the job** (`FailureTracker`). Failures arrive from every side
   at about the same time: a rank's traceback, its supervisor's exit status, a lost
   Spark task, mpirun's exit. The first one is kept, except that a rank's own failure
   noticed within `FAILURE_SETTLE_S` replaces a failure outside any rank (it explains a
   lost task or mpirun's exit better). The tracker also owns the driver's wait for the
   job: success, the first failure, a resize (`WorldResize`), an in-process world's
   change (`WorldChange`), or a time limit; and it
   builds the error the job raises (its classes and their text are in
   `sparkdist/errors.py`, shared by every layer).
3. **Which failed jobs are relaunched** (`RelaunchBudget`, `HorovodRunner(max_failures=k)`).
   A job is relaunched, as a whole, when it failed for a reason outside the training
   code: an executor or host was lost, a rank was killed (SIGKILL: the OOM killer, a
   preempted machine, an operator), or the job failed outside any rank. An exception
   raised by the training code is a bug or bad data that a relaunch would only repeat,
   so it is not retried unless asked (`retry_on_exception=True`). Errors that a relaunch
   cannot cure are never retried: an unpicklable function, too few task slots, a time
   limit, Ctrl-C. Apart from those, a job whose mpirun could not start its daemons,
   before any rank started, is launched once more whatever `max_failures` says: none of
   the user's code ran, and Open MPI's start-up fails now and then on a loaded host when
   several daemons of one job share a machine ("orte_session_dir failed", "ORTE was
   unable to reliably start one or more daemons").
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from sparkdist.errors import (
    JobFailedError,
    JobTimeoutError,
    NotEnoughSlotsError,
    PayloadError,
    RankFailedError,
    describe_exit,
)
from sparkdist.runner.driver.job_spec import JobSpec
from sparkdist.runner.driver.membership import Loss, Membership
from sparkdist.runner.driver.records import Growth, Processes, RankRecords, SparkTasks
from sparkdist.trace.recorder import JobTrace

logger = logging.getLogger(__name__)

FAILURE_SETTLE_S = 3.0
"""After a rank reports an exception, how long to wait for its exit status and last
output lines before reporting the failure anyway."""
PASSED_ON_SETTLE_S = 10.0
"""How long a rank's end by a SIGTERM its supervisor passed on (orted ending the job,
Spark stopping its task, an operator) waits for a lost contact that explains it."""
NEVER_RETRIED = (PayloadError, NotEnoughSlotsError, JobTimeoutError)
MPI_START_FAILURES = ("orte_session_dir failed", "ORTE was unable to reliably start")


class WorldResize(Exception):
    """Not a failure: an elastic job's rank 0 stopped at a checkpoint so that the job
    can relaunch with more ranks (`runner/driver/launch/gang_kind.py`), or without an
    executor being decommissioned (`left`, `notices.py`)."""

    def __init__(self, reason: str, left: bool = False):
        super().__init__(reason)
        self.left = left


class WorldChange(Exception):
    """Not a failure: an in-process elastic world (`membership.py`) lost members
    (`grow=False`), has tasks standing by to grow into (`grow=True`), or members leave an
    executor being decommissioned (`leave=True`, `notices.py`). Its ranks run on; the
    driver's loop of attempts (`job.py`) decides what becomes of it."""

    def __init__(self, reason: str, grow: bool, leave: bool = False):
        super().__init__(reason)
        self.reason, self.grow, self.leave = reason, grow, leave


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
    lost_contact: bool = False
    """The driver lost a Spark task (its executor, host or network gone)."""
    passed_on: bool = False
    """The rank died of a SIGTERM its supervisor passed on, not of its own code: the
    machinery stopping it is a consequence (of a lost host, say), not a cause."""


# --- 1. which ends fail the job ----------------------------------------------------------


class Losses:
    """Records how a rank, a task or the launcher ended, and tells the failure tracker
    when that fails the job."""

    def __init__(
        self,
        job: JobSpec,
        ranks: RankRecords,
        tasks: SparkTasks,
        processes: Processes,
        failures: FailureTracker,
        membership: Membership,
        trace: JobTrace | None = None,
    ):
        self._trace = trace if trace is not None else JobTrace(job.job_id, enabled=False)
        self._job = job
        self._ranks = ranks
        self._tasks = tasks
        self._processes = processes
        self._failures = failures
        self._membership = membership
        self.workers_lost: set[int] = set()
        """Parameter-server workers the job went on without."""
        self._silenced: dict[int, str] = {}
        """Ranks the stall watch kills (silent in an in-process world): why."""

    def silenced(self, rank: int, reason: str) -> None:
        """The stall watch kills rank `rank` (`stalls.StallWatch`): its end, when it comes,
        is lost for `reason` (it was silent), not for the signal that ended it."""
        with self._ranks.cond:
            self._silenced[rank] = reason

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
        per_task = self._job.ranks_per_task
        ranks = [r for r in range(first, first + per_task) if r in self._ranks.by_rank]
        for lost in ranks:
            self._trace.rank_ended(lost, "failed", reason)
        # Each of the task's ranks is lost with it (in process: a member to go on without).
        if ranks and all(self._membership.lose(r, reason, True) for r in ranks):
            return
        self._failures.notice(rank, reason, outside_user_code=True, lost_contact=True)

    def task_lost_by(self, by: int, index: int, host: str, detail: str) -> None:
        """Task `by` lost its channel to task `index` (`messages.TaskLost`): the task is
        lost as if the driver's own channel to it broke. That breaks on the same
        timeout, but may be noticed after the daemons' ends made the other ranks'."""
        if not 0 <= index < self._tasks.num_tasks:
            logger.warning("job %s: task %d lost an unknown task %d", self._job.job_id, by, index)
            return
        logger.info(
            "sparkdist job %s: task %d lost its channel to task %d on host %s (%s)",
            self._job.job_id,
            by,
            index,
            host,
            detail,
        )
        self.task_lost(index, host)

    def supervisor_lost(self, rank: int) -> None:
        """A rank's supervisor's connection broke before it reported the rank's exit."""
        with self._ranks.cond:
            exited = self._ranks.by_rank[rank].exited
        if exited:
            return
        if self._job.tolerates_loss(rank):
            self.worker_lost(rank, None)
            return
        reason = self._silenced.get(rank) or (
            f"lost contact with rank {rank} (its supervisor process died, or its host "
            "or network was lost)"
        )
        self._trace.rank_ended(rank, "failed", reason)
        if not self._membership.lose(rank, reason, outside_user_code=False):
            self._failures.notice(rank, reason)

    def rank_error(self, rank: int, traceback: str, reason: str) -> None:
        """The rank's function raised (no failure once the world went on without it)."""
        self._ranks.error(rank, traceback)
        if rank not in self._membership.left:
            self._failures.notice(rank, reason)

    def rank_exited(
        self, rank: int, exit_code: int, tail: list[str], passed_on: bool = False
    ) -> None:
        """The rank ended (`passed_on`: of a SIGTERM its supervisor passed on to it)."""
        self._ranks.exited(rank, exit_code, tail)
        if exit_code == 0 or rank in self._membership.left:
            return
        raised = self._ranks.by_rank[rank].traceback is not None
        # Lost, not the training code's failure: killed, or (an elastic job) ended non-zero
        # without raising (os._exit), whether its peers' collectives raised first or not.
        elastic = self._membership.min_np is not None
        killed = not raised and (exit_code == -signal.SIGKILL or (elastic and not passed_on))
        if self._job.tolerates_loss(rank) and not raised:
            self.worker_lost(rank, exit_code)
        elif raised or not self._membership.lose(rank, self._ended(rank, exit_code), killed):
            passed_on = passed_on and not raised and exit_code < 0
            self._failures.notice(rank, None, outside_user_code=killed, passed_on=passed_on)

    def _ended(self, rank: int, exit_code: int) -> str:
        host = self._ranks.by_rank[rank].host
        silenced = self._silenced.get(rank)
        return silenced or f"rank {rank} on host {host} ended with {describe_exit(exit_code)}"

    def refused(self, losses: list[Loss]) -> None:
        """The job's loop did not re-form the world in process after `losses`: they
        fail the job as any loss does (and it may be relaunched)."""
        for loss in losses:
            self._failures.notice(loss.rank, loss.reason, outside_user_code=loss.outside_user_code)

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
                "on the %d worker(s) left",
                self._job.job_id,
                rank,
                how,
                left,
            )
            return
        self._failures.notice(
            rank,
            f"every worker of the parameter-server job was lost (the last, rank {rank}, {how})",
            outside_user_code=True,
        )

    def launcher_exited(self, name: str, exit_code: int, rank: int = -1) -> None:
        """mpirun (or a direct launcher's supervisor process of `rank`) ended. A
        supervisor whose rank's end was reported (or that an in-process world went on
        without) adds nothing: that end is the failure, or none."""
        self._processes.launcher_exited(name, exit_code)
        if rank >= 0:
            with self._ranks.cond:
                state = self._ranks.by_rank.get(rank)
                if self._membership.gone(rank) or (state is not None and state.exited):
                    return
        if exit_code != 0:
            self._failures.notice(None, f"{name} exited with code {exit_code}")

    def fail(self, reason: str, task_raised: bool = False) -> None:
        """A failure seen outside the ranks (e.g. the Spark stage itself failed; with
        `task_raised`, because a task's own code raised)."""
        self._failures.notice(None, reason, task_raised=task_raised)


# --- 2. which failure explains the job, and the wait for it -------------------------------


class FailureTracker:
    """The failures of one job, and the driver's wait for it. Reads the job's ranks,
    tasks, processes and growth under the job's lock (`cond`); `succeeded` says whether
    the job is done."""

    def __init__(
        self,
        cond: threading.Condition,
        ranks: RankRecords,
        tasks: SparkTasks,
        processes: Processes,
        growth: Growth,
        membership: Membership,
        succeeded: Callable[[], bool],
    ):
        self._cond = cond
        self.ranks = ranks
        self._tasks = tasks
        self._processes = processes
        self._growth = growth
        self._membership = membership
        self._succeeded = succeeded
        self._first: Failure | None = None
        self._noticed: list[Failure] = []
        self._stopping: str | None = None
        self._ended: BaseException | None = None

    @property
    def stopping(self) -> str | None:
        """Why the job is being stopped on purpose, or None."""
        return self._stopping

    @property
    def failed(self) -> bool:
        """Whether a failure was noticed: the attempt ends (or the job relaunches)."""
        return self._first is not None or self._ended is not None

    def stop(self, reason: str) -> None:
        """The job is being aborted (or stops to grow): later losses are expected, not
        failures."""
        with self._cond:
            self._stopping = reason

    def notice(
        self,
        rank: int | None,
        reason: str | None,
        outside_user_code: bool = False,
        task_raised: bool = False,
        lost_contact: bool = False,
        passed_on: bool = False,
    ) -> None:
        """Remember a failure; the first one (see above) explains the job's."""
        with self._cond:
            if self._stopping and self._first is None:
                return  # the job is being stopped on purpose: losses are expected
            now = time.monotonic()
            failure = Failure(
                rank, reason, now, outside_user_code, task_raised, lost_contact, passed_on
            )
            logger.debug("failure noticed: %s", failure)
            if not self._stopping:
                self._noticed.append(failure)
            first = self._first
            if first is None or (
                now - first.noticed_at < _settle_s(first)
                and _explains_better(failure, first, stopping=self._stopping is not None)
            ):
                self._first = failure
            self._cond.notify_all()

    def fail_now(self, error: BaseException) -> None:
        """End the job's wait with `error` (a stall, `stalls.StallWatch`)."""
        with self._cond:
            self._ended = error
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
                state = self.ranks.by_rank[first.rank]
                code = state.exit_code
                if state.traceback is None and code is not None and code < 0:
                    return self._describe(first)
            return None

    def _describe(self, failure: Failure) -> str:
        if failure.rank is None:
            return failure.reason or "unknown"
        state = self.ranks.by_rank[failure.rank]
        if failure.reason:
            return f"rank {failure.rank} on host {state.host}: {failure.reason}"
        return (
            f"rank {failure.rank} on host {state.host} ended with {describe_exit(state.exit_code)}"
        )

    def _ready(self) -> bool:
        """Whether the first failure can be reported: its rank's exit status (and so its
        last lines) arrived, or it settled."""
        failure = self._first
        if failure is None:
            return False
        settled = time.monotonic() - failure.noticed_at >= _settle_s(failure)
        if failure.rank is None or failure.passed_on:
            return settled
        return self.ranks.by_rank[failure.rank].exited or settled

    def wait(
        self, start_deadline: float | None, deadline: float | None, launcher_expected: bool
    ) -> None:
        """Block until the job succeeded, failed, or ran out of time; raise on the latter
        two (and `WorldResize` when rank 0 stopped for the job to grow, `WorldChange`
        when an in-process world lost members or can grow)."""
        ranks, membership = self.ranks, self._membership
        with self._cond:
            while True:
                if self._ended is not None:
                    raise self._ended
                if self._growth.resizing is not None and ranks.by_rank[0].exited:
                    raise WorldResize(self._growth.resizing, left=self._growth.leave)
                if self._ready():
                    raise self._error()
                if membership.leaving:
                    raise WorldChange("; ".join(membership.leaving.values()), False, leave=True)
                if membership.pending:
                    reason = "; ".join(loss.reason for loss in membership.pending.values())
                    raise WorldChange(reason, grow=False)
                waited_out = membership.waited_out()
                if waited_out is not None:  # below min_np too long: the loop refuses it
                    raise WorldChange(waited_out, grow=False)
                if (
                    self._growth.reason is not None
                    and not self._growth.leave
                    and (membership.in_process())
                ):  # a leave is never taken as a grow
                    raise WorldChange(self._growth.take(), grow=True)
                launcher_done = not launcher_expected or self._processes.launcher_exit_code == 0
                if self._succeeded() and launcher_done:
                    return
                now = time.monotonic()
                if start_deadline and now > start_deadline and not ranks.all_started():
                    raise _start_timeout(ranks, self._tasks)
                if deadline and now > deadline:
                    running = ranks.running()
                    raise JobTimeoutError(
                        f"timeout: ranks {running} were still running when the job's time "
                        "limit ran out; the job was stopped." + ranks.tails(running)
                    )
                self._cond.wait(0.2)

    def _error(self) -> JobFailedError:
        """The error that reports the first failure (a rank's shows its traceback once:
        the rank also printed it, so those lines are left out of its output tail)."""
        failure = self._first
        assert failure is not None
        if failure.rank is None:
            return JobFailedError(failure.reason or "unknown", list(self._processes.launcher_tail))
        state = self.ranks.by_rank[failure.rank]
        reason = failure.reason
        if state.traceback is None and failure.rank in self._tasks.lost:
            # The rank's task was lost too: its executor (or host) is the better explanation.
            reason = self._tasks.lost[failure.rank]
        tail = list(state.tail)
        if state.traceback:
            printed = set(state.traceback.splitlines())
            tail = [line for line in tail if line not in printed]
        return RankFailedError(
            rank=state.rank,
            host=state.host,
            exit_code=state.exit_code,
            traceback=state.traceback,
            output_tail=tail,
            reason=reason,
        )


def _start_timeout(ranks: RankRecords, tasks: SparkTasks) -> JobTimeoutError:
    missing = ranks.not_started()
    return JobTimeoutError(
        f"start timeout: ranks {missing} of {len(ranks.by_rank)} had not started; "
        f"Spark tasks started: {sorted(tasks.started)}. The cluster may lack free "
        "task slots for a barrier stage of this size (other jobs running?), or rank "
        "start-up is slow: raise HorovodRunner(start_timeout=...)." + ranks.tails(missing)
    )


def _settle_s(first: Failure) -> float:
    """How long after `first` a failure that explains the job better may replace it (and
    so how long `first` waits before it is reported, once its rank's end is known)."""
    return PASSED_ON_SETTLE_S if first.passed_on else FAILURE_SETTLE_S


def _explains_better(new: Failure, first: Failure, stopping: bool) -> bool:
    """Whether a failure noticed soon after the first one explains the job's better.

    A rank's failure explains more than one without a rank (mpirun's exit, the Spark stage
    failing). But a task that raised, before the job was being stopped, is the cause of the
    losses that follow: Spark cancels the other tasks, whose connections then break, in
    either order. A lost contact (a host cut off, its executor gone) explains a rank that
    the machinery stopped (a SIGTERM its supervisor passed on: orted ending the job, Spark
    cancelling its task) up to `PASSED_ON_SETTLE_S` before it: a connection to a cut-off
    host breaks only on its timeout, seconds after the others were stopped.
    """
    if new.task_raised:
        return first.outside_user_code and not stopping
    if first.task_raised:
        return False
    if first.passed_on:
        return new.lost_contact
    return first.rank is None and new.rank is not None


# --- 3. which failed jobs are relaunched --------------------------------------------------


def retry_reason(
    exc: BaseException, failures: FailureTracker, retry_on_exception: bool
) -> str | None:
    """Why the job that failed with `exc` may be relaunched, or None if it may not."""
    if not isinstance(exc, JobFailedError) or isinstance(exc, NEVER_RETRIED):
        return None
    cause = failures.outside_user_code()
    if cause:
        return cause
    if not isinstance(exc, RankFailedError):
        return f"the job failed outside any rank: {exc.reason}"
    if retry_on_exception:
        return f"rank {exc.rank} failed and retry_on_exception=True: {exc.reason or 'exit'}"
    return None


def mpi_start_failed(exc: BaseException, failures: FailureTracker) -> bool:
    """Whether mpirun failed to start the job's daemons before any rank started, so that
    launching the job again repeats nothing of the user's."""
    if not isinstance(exc, JobFailedError) or isinstance(exc, RankFailedError):
        return False
    if any(rank.started for rank in failures.ranks.by_rank.values()):
        return False
    return any(sign in line for line in exc.output_tail for sign in MPI_START_FAILURES)


class Relaunch(NamedTuple):
    reason: str
    counted: bool
    """False for the one start-up relaunch, which `max_failures` does not count."""
    output_tail: tuple[str, ...] = ()
    """The start-up relaunch: what Open MPI said."""


class RelaunchBudget:
    """A job's relaunches: the one after mpirun could not start, and up to
    `max_failures` after failures outside the training code (None: no limit, an
    elastic job's default, bounded instead by min_np and start_timeout)."""

    def __init__(self, max_failures: int | None, retry_on_exception: bool):
        self.max_failures = max_failures
        self.retry_on_exception = retry_on_exception
        self.used = 0
        self._start_retried = False

    def relaunch(self, exc: BaseException, failures: FailureTracker) -> Relaunch | None:
        """Why the attempt that failed with `exc` is launched again, or None."""
        if not self._start_retried and mpi_start_failed(exc, failures):
            self._start_retried = True
            tail = tuple(getattr(exc, "output_tail", ()))
            return Relaunch("mpirun could not start its daemons", False, tail)
        reason = retry_reason(exc, failures, self.retry_on_exception)
        if reason is None or self.exhausted():
            return None
        self.used += 1
        return Relaunch(reason, counted=True)

    def reform(self) -> bool:
        """Whether an in-process world may go on without the members it lost: such a
        loss is a fault like any other, so it counts as a relaunch would."""
        if self.exhausted():
            return False
        self.used += 1
        return True

    def returned(self, counted: int) -> None:
        """A wait below min_np that counted `counted` faults ends in a relaunch, which
        counts them once more: the wait's count is given back."""
        self.used = max(0, self.used - counted)

    def exhausted(self) -> bool:
        return self.max_failures is not None and self.used >= self.max_failures
