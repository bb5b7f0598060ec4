"""Which failed jobs are relaunched (`HorovodRunner(max_failures=k)`), and why.

A job is relaunched, as a whole, when it failed for a reason outside the training code:
an executor or host was lost, a rank was killed (SIGKILL: the OOM killer, a preempted
machine, an operator), or the job failed outside any rank. An exception raised by the
training code is a bug or bad data that a relaunch would only repeat, so it is not
retried unless asked (`retry_on_exception=True`). Errors that a relaunch cannot cure are
never retried: an unpicklable function, too few task slots, a time limit, Ctrl-C.

Apart from those relaunches, a job whose mpirun could not start its daemons, before any
rank started, is launched once more whatever `max_failures` says (`mpi_start_failed`):
none of the user's code ran, and Open MPI's start-up fails now and then on a loaded host
when several daemons of one job share a machine ("orte_session_dir failed", "ORTE was
unable to reliably start one or more daemons").
"""

from __future__ import annotations

from typing import NamedTuple

from sparkdist.errors import (
    JobFailedError,
    JobTimeoutError,
    NotEnoughSlotsError,
    PayloadError,
    RankFailedError,
)
from sparkdist.runner.driver.job_state import JobState

NEVER_RETRIED = (PayloadError, NotEnoughSlotsError, JobTimeoutError)
MPI_START_FAILURES = ("orte_session_dir failed", "ORTE was unable to reliably start")


def retry_reason(exc: BaseException, state: JobState, retry_on_exception: bool) -> str | None:
    """Why the job that failed with `exc` may be relaunched, or None if it may not."""
    if not isinstance(exc, JobFailedError) or isinstance(exc, NEVER_RETRIED):
        return None
    cause = state.failures.outside_user_code()
    if cause:
        return cause
    if not isinstance(exc, RankFailedError):
        return f"the job failed outside any rank: {exc.reason}"
    if retry_on_exception:
        return f"rank {exc.rank} failed and retry_on_exception=True: {exc.reason or 'exit'}"
    return None


def mpi_start_failed(exc: BaseException, state: JobState) -> bool:
    """Whether mpirun failed to start the job's daemons before any rank started, so that
    launching the job again repeats nothing of the user's."""
    if not isinstance(exc, JobFailedError) or isinstance(exc, RankFailedError):
        return False
    if any(rank.started for rank in state.ranks.values()):
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

    def relaunch(self, exc: BaseException, state: JobState) -> Relaunch | None:
        """Why the attempt that failed with `exc` is launched again, or None."""
        if not self._start_retried and mpi_start_failed(exc, state):
            self._start_retried = True
            tail = tuple(getattr(exc, "output_tail", ()))
            return Relaunch("mpirun could not start its daemons", False, tail)
        reason = retry_reason(exc, state, self.retry_on_exception)
        if reason is None or self.exhausted():
            return None
        self.used += 1
        return Relaunch(reason, counted=True)

    def exhausted(self) -> bool:
        return self.max_failures is not None and self.used >= self.max_failures
