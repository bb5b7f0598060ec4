"""Which failure explains a job's: a task that raised is the cause of the task losses
Spark's cancelling brings, in whichever order the driver notices them; a lost executor
is explained by its lost task, not by the stage failure it causes."""

from __future__ import annotations

import time

import pytest

from sparkdist.errors import JobFailedError
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
