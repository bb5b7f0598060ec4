"""The driver's job state, driven by the events its service turns messages into (no
Spark): a parameter-server job survives losing a worker but not every worker, and an
elastic job's growth stops rank 0 at a checkpoint and ends the attempt as a resize."""

from __future__ import annotations

import signal
import time

import pytest

from sparkdist.errors import JobFailedError
from sparkdist.roles import Roles
from sparkdist.runner.driver.failures import WorldResize
from sparkdist.runner.driver.job_spec import JobSpec
from sparkdist.runner.driver.job_state import JobState

KILLED = -signal.SIGKILL


def parameter_server_job() -> JobState:
    """chief rank 0, workers 1 and 2, parameter server 3; every rank started."""
    roles = Roles(chief=1, worker=2, ps=1)
    state = JobState(JobSpec("ps-job", 4, b"payload", False, "none", roles=roles))
    for rank in range(4):
        state.rank_records.started(rank, f"host-{rank}")
    return state


def wait(state: JobState) -> None:
    state.failures.wait(None, time.monotonic() + 30, launcher_expected=False)


def test_a_parameter_server_job_goes_on_without_a_killed_worker(caplog):
    state = parameter_server_job()
    with caplog.at_level("WARNING"):
        state.losses.rank_exited(2, KILLED, ["last words"])
    assert state.losses.workers_lost == {2}
    assert "worker rank 2 ended with signal SIGKILL (9)" in caplog.text
    assert "1 worker(s) left" in caplog.text
    assert not state.succeeded()  # the chief has not returned yet
    state.rank_result(0, b"result", ["tensorflow"])
    for rank in (0, 1, 3):
        state.losses.rank_exited(rank, 0, [])
    wait(state)  # returns: the job succeeded
    assert state.rank_records.results()[0] == b"result" and state.rank_records.frameworks == [
        "tensorflow"
    ]
    assert state.failures.outside_user_code() is None


def test_a_parameter_server_job_fails_when_every_worker_is_lost():
    state = parameter_server_job()
    state.losses.supervisor_lost(1)  # its host gone: no exit status ever comes
    assert state.losses.workers_lost == {1}
    state.losses.rank_exited(2, KILLED, [])
    with pytest.raises(JobFailedError) as failed:
        wait(state)
    assert "every worker of the parameter-server job was lost" in str(failed.value)
    assert "the last, rank 2, ended with signal SIGKILL" in state.failures.outside_user_code()


def test_growth_stops_rank_0_at_its_next_checkpoint_and_ends_the_attempt():
    state = JobState(JobSpec("elastic", 2, b"payload", False, "none"))
    assert state.answer_checkpoint(0, 3) is None  # nobody asked to grow
    state.growth.request("2 more slots stayed free")
    assert state.answer_checkpoint(1, 5) is None  # only rank 0 is told
    assert state.answer_checkpoint(0, 5) == "grow"
    assert state.answer_checkpoint(0, 6) is None  # told once
    assert state.failures.stopping == "growing"
    state.losses.task_lost(1, "10.0.0.2")  # Spark cancelling the attempt: expected, no failure
    state.losses.rank_exited(0, 0, [])
    with pytest.raises(WorldResize, match="2 more slots stayed free; resuming from step 5"):
        wait(state)
