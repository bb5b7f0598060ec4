"""Which failure explains a job's: a task that raised is the cause of the task losses
Spark's cancelling brings, in whichever order the driver notices them; a lost executor
is explained by its lost task, not by the stage failure it causes."""

from __future__ import annotations

import threading
import time

import pytest

from sparkdist.errors import JobFailedError
from sparkdist.runner.driver.failures import FAILURE_SETTLE_S, PASSED_ON_SETTLE_S
from sparkdist.runner.driver.job_spec import JobSpec
from sparkdist.runner.driver.job_state import JobState

RAISED = "the Spark barrier stage failed: ValueError: network interface 'tn1' does not exist"
EXECUTOR_LOST = "the Spark barrier stage failed: Job aborted: ExecutorLostFailure (executor 1)"


def reported(notices) -> tuple[str, str | None]:
    """(the job's error, its outside-user-code cause) after the given notices."""
    state = JobState(JobSpec("job", 3, b"payload", False, "all"))
    for notice in notices:
        notice(state)
    with pytest.raises(JobFailedError) as failed:
        state.failures.wait(None, time.monotonic() + 30, launcher_expected=False)
    return str(failed.value), state.failures.outside_user_code()


def lost(state):
    state.losses.task_lost(1, "10.0.0.2")


def raised(state):
    state.losses.fail(RAISED, task_raised=True)


def executor_lost(state):
    state.losses.fail(EXECUTOR_LOST)


@pytest.mark.parametrize(
    "order", [(lost, raised), (raised, lost)], ids=["lost-first", "raised-first"]
)
def test_a_task_that_raised_explains_the_losses_that_follow(order):
    error, outside = reported(order)
    assert "network interface 'tn1' does not exist" in error.splitlines()[0]
    assert outside is None  # the task's own error: not retried as a lost executor


def test_a_lost_executor_is_explained_by_its_lost_task():
    error, outside = reported([lost, executor_lost])
    assert "lost contact with Spark task 1" in error.splitlines()[0]
    assert "executor died" in outside


def test_a_task_lost_by_another_task_explains_the_ranks_stopped_after_it():
    """Task 1's agent lost task 0's relay (`messages.TaskLost`), then stopped its daemon,
    whose rank died of SIGTERM: the lost task explains the job, as if the driver's own
    channel to it had broken first."""
    error, outside = reported(
        [
            lambda state: state.losses.task_lost_by(1, 0, "10.0.0.1", "EOFError: closed"),
            lambda state: state.losses.rank_exited(1, -15, []),
        ]
    )
    assert "rank 0 on host 10.0.0.1 failed first: lost contact with Spark task 0" in error
    assert "executor died" in outside


# --- a rank the machinery stopped, and a lost contact (issue 64) --------------------------


def passed_on_sigterm(state):
    """Rank 0 died of a SIGTERM its supervisor passed on (orted ending the job, Spark
    stopping its task): not its own doing."""
    state.losses.rank_exited(0, -15, [], passed_on=True)


def later(seconds, notice):
    """`notice`, `seconds` after the others: past FAILURE_SETTLE_S, as a cut-off host's
    connection breaks on its timeout, seconds after the rest of its job was stopped."""

    def noticed(state):
        timer = threading.Timer(seconds, notice, args=(state,))
        timer.daemon = True
        timer.start()

    return noticed


def test_a_lost_contact_explains_a_rank_the_machinery_stopped_seconds_before():
    gap = FAILURE_SETTLE_S + 1
    error, outside = reported([passed_on_sigterm, later(gap, lost)])
    assert "lost contact with Spark task 1" in error.splitlines()[0], error
    assert "executor died" in outside


def test_a_rank_the_machinery_stopped_is_reported_once_no_lost_contact_came():
    started = time.monotonic()
    error, outside = reported([passed_on_sigterm])
    waited = time.monotonic() - started
    assert PASSED_ON_SETTLE_S <= waited < PASSED_ON_SETTLE_S + 2, waited
    assert "rank 0" in error.splitlines()[0] and "SIGTERM" in error, error
    assert "SIGTERM" in outside


def test_a_rank_that_died_of_its_own_sigterm_is_not_explained_by_a_later_loss():
    """A SIGTERM that no supervisor passed on (the rank's own code, or sent to it alone)
    is reported at once, as before; a loss after it changes nothing."""
    started = time.monotonic()
    error, _ = reported([lambda state: state.losses.rank_exited(0, -15, []), lost])
    assert time.monotonic() - started < FAILURE_SETTLE_S, "reported late"
    assert "rank 0" in error.splitlines()[0] and "SIGTERM" in error, error


def test_a_ranks_error_does_not_replace_a_rank_the_machinery_stopped():
    """Its peers' collectives raise once it is gone: a consequence too."""

    def peer_raised(state):
        state.losses.rank_error(1, "Traceback\nRuntimeError: gloo", "gloo")

    error, _ = reported([passed_on_sigterm, peer_raised])
    assert "rank 0" in error.splitlines()[0] and "SIGTERM" in error, error
