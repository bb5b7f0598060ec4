"""Stall detection for an in-process elastic job (`sparkdist.elastic.run`, issue 48) on
the driver (np < 0, the direct launcher, no Spark): a rank blocked in the user's code
inside the elastic training function is named with its stack, its peer in the collective
with its own, and nothing is left running; commits are signs of life, so a job that
commits but prints nothing is not called stalled.

The blocked job's ranks print a line a second until training starts (importing torch
takes seconds on a loaded machine), so its short stall timeout counts from the stall; the
assertions still look for the warning whose stacks are in the training function. The
driver warns once per silent spell, so the commits' job prints a line on entering `train`:
without `alive("commits")` its silent spell starts there and is warned about (checked by
hand: the second test then fails)."""

from __future__ import annotations

import logging
import threading

import pytest
import stall_jobs
from helpers import assert_nothing_left

from sparkdist import HorovodRunner
from sparkdist.errors import JobStalledError

ENV = {"SPARKDIST_ELASTIC_TIMEOUT_S": "300"}
"""Longer than the test: the stall watch, not gloo's timeout, ends the stalled collective."""
IN_TRAIN = " <- train (stall_jobs.py:"
TRAIN = "train (stall_jobs.py:"
"""In a stack: a frame of the training function (innermost when it sleeps)."""


class Warnings(logging.Handler):
    """The stall warnings whose stacks are inside the training function."""

    def __init__(self) -> None:
        super().__init__()
        self.in_train: list[str] = []
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "stall_warning=" in message and TRAIN in message:
            self.in_train.append(message)
            self.seen.set()


@pytest.fixture
def warnings():
    handler = Warnings()
    logging.getLogger("sparkdist").addHandler(handler)
    yield handler
    logging.getLogger("sparkdist").removeHandler(handler)


def _assert_blocked_and_waiting(where: str) -> None:
    assert "rank 0 (host " in where and f"all_reduce{IN_TRAIN}" in where, where
    assert "rank 1 (host " in where and "stuck (stall_jobs.py:" in where, where
    assert where.count(IN_TRAIN) == 2, where  # the user's function, on both ranks


def test_a_stalled_elastic_job_names_the_blocked_rank_and_the_collective(tmp_path, warnings):
    lock = tmp_path / "lock"
    lock.touch()
    runner = HorovodRunner(np=-2, launcher="direct", stall_warning=3, stall_timeout=8, env=ENV)
    with pytest.raises(JobStalledError) as failed:
        runner.run(stall_jobs.elastic_lock_job, lock_file=str(lock))
    assert "stalled: no rank showed a sign of life" in str(failed.value)
    _assert_blocked_and_waiting(failed.value.stacks)
    assert warnings.seen.is_set()
    _assert_blocked_and_waiting(warnings.in_train[0])
    assert_nothing_left(runner)


def test_elastic_commits_are_signs_of_life(warnings):
    runner = HorovodRunner(np=-2, launcher="direct", stall_warning=4, env=ENV)
    steps = runner.run_all(stall_jobs.elastic_silent_commits, seconds=10)
    assert all(step > 20 for step in steps), steps  # ten seconds of commits in silence
    assert warnings.in_train == []
    assert_nothing_left(runner)
