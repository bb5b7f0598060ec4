"""How many losses outside `main` a job survives when `max_failures` is not given: an
elastic job (min_np/max_np) every one, as Horovod's elastic `reset_limit` defaults to
none (min_np and start_timeout bound it); a fixed-size job none. Real Spark
(local-cluster, two one-core executors)."""

from __future__ import annotations

import json
import os
import signal

import pytest

import sparkdist
from sparkdist import checkpoint
from sparkdist.errors import JobFailedError
from sparkdist.runner.driver.job_spec import RunnerOptions


def test_not_given_means_no_limit_when_elastic_and_none_when_fixed():
    assert RunnerOptions(np=2, min_np=1, max_np=2).relaunch_limit is None
    assert RunnerOptions(np=2, max_np=3).relaunch_limit is None
    assert RunnerOptions(np=2).relaunch_limit == 0
    assert RunnerOptions(np=2, min_np=1, max_failures=1).relaunch_limit == 1


def killed_twice_main(progress: str) -> dict:
    """Checkpointed steps; in the first two attempts the rank dies of SIGKILL at its
    second step (a loss outside `main`, as a lost executor's)."""
    found = checkpoint.resume()
    step = found.step if found else 0
    while step < 3:
        step += 1
        if step >= 2 and checkpoint.attempt() < 2:
            os.kill(os.getpid(), signal.SIGKILL)
        checkpoint.save({}, step)
        with open(progress, "a") as out:
            out.write(json.dumps({"step": step, "attempt": checkpoint.attempt()}) + "\n")
    return {"attempt": checkpoint.attempt()}


def test_elastic_job_survives_two_losses_without_max_failures(sc, tmp_path, caplog):
    """A one-rank elastic world (cheap: no collective waits on the lost rank), lost twice,
    resumes each time from its checkpoint."""
    progress = tmp_path / "progress.jsonl"
    runner = sparkdist.HorovodRunner(np=1, min_np=1, max_np=1)
    with caplog.at_level("WARNING"):
        result = runner.run(killed_twice_main, progress=str(progress))
    assert result["attempt"] == 2
    failures = runner.last_job.failures
    assert len(failures) == 2 and all("SIGKILL" in f for f in failures), failures
    seen = [json.loads(line) for line in progress.read_text().splitlines()]
    assert seen == [{"step": 1, "attempt": 0}, {"step": 2, "attempt": 2}, {"step": 3, "attempt": 2}]
    relaunches = [r.getMessage() for r in caplog.records if "; no limit" in r.getMessage()]
    assert len(relaunches) == 2, relaunches
    assert "world 1 -> 1 ranks" in relaunches[0] and "(relaunch 1;" in relaunches[0]
    assert "resuming from step 1" in relaunches[1] and "(relaunch 2;" in relaunches[1]


def rank1_killed() -> int:
    if int(os.environ["RANK"]) == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return 0


def test_fixed_size_job_still_fails_on_its_first_loss(sc):
    runner = sparkdist.HorovodRunner(np=2)
    with pytest.raises(JobFailedError):
        runner.run(rank1_killed)
    assert runner.last_job.attempts == 1 and runner.last_job.failures == []
