"""Which failed jobs are relaunched (`HorovodRunner(max_failures=k)`), and why.

A job is relaunched, as a whole, when it failed for a reason outside the training code:
an executor or host was lost, a rank was killed (SIGKILL: the OOM killer, a preempted
machine, an operator), or the job failed outside any rank. An exception raised by the
training code is a bug or bad data that a relaunch would only repeat, so it is not
retried unless asked (`retry_on_exception=True`). Errors that a relaunch cannot cure are
never retried: an unpicklable function, too few task slots, a time limit, Ctrl-C.
"""

from __future__ import annotations

from sparkdist.errors import (
    JobFailedError,
    JobTimeoutError,
    NotEnoughSlotsError,
    PayloadError,
    RankFailedError,
)
from sparkdist.runner.driver.job_state import JobState

NEVER_RETRIED = (PayloadError, NotEnoughSlotsError, JobTimeoutError)


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
