"""Which failure explains a job when the machinery stopped a rank seconds before the
driver lost contact with another task (issue 64), on real Spark (local-cluster, the
session's two executors) with real ranks, one per task:

rank 0's supervisor gets a SIGTERM (as orted or Spark stopping its task sends) and passes
it on; the rank dies of it. `FAILURE_SETTLE_S` + 1 s later task 1's Python worker is
SIGKILLed (its executor's loss, as the driver sees it: the task's channel breaks). The
lost contact explains the job, not rank 0's SIGTERM (before, rank 0's end was reported
at once and the job blamed it).

And in a relayed job (its supervisors leave their rank's stacks when cut off), a lost
task's abort makes the other supervisors leave theirs too.
"""

from __future__ import annotations

import glob
import os
import signal
import threading
import time

import psutil
import pytest
from helpers import assert_nothing_left, wait_for

from sparkdist import HorovodRunner, RankFailedError, job_environment
from sparkdist.protocol import left_stacks
from sparkdist.runner.driver.failures import FAILURE_SETTLE_S


def wait_named(directory: str) -> int:
    """Write this rank's pid and its supervisor's, then wait (the test ends the job)."""
    import os
    import time

    rank = os.environ["RANK"]
    path = os.path.join(directory, f"rank-{rank}")
    with open(f"{path}.new", "w") as f:
        f.write(f"{os.getpid()} {os.getppid()}")
    os.replace(f"{path}.new", path)
    time.sleep(120)
    return 0


def _pids(path) -> tuple[int, int]:
    rank, supervisor = path.read_text().split()
    return int(rank), int(supervisor)


def test_a_lost_contact_explains_a_rank_the_machinery_stopped_seconds_before(sc, tmp_path):
    runner = HorovodRunner(np=2, launcher="direct", max_failures=0, start_timeout=120)
    outcome: dict = {}

    def cut_after_stop() -> None:
        named = [tmp_path / "rank-0", tmp_path / "rank-1"]
        wait_for(lambda: all(p.exists() for p in named), "both ranks to start")
        rank0, supervisor0 = _pids(named[0])
        _, supervisor1 = _pids(named[1])
        worker1 = psutil.Process(supervisor1).ppid()  # task 1's Python worker
        outcome["worker"] = psutil.Process(worker1).cmdline()
        os.kill(supervisor0, signal.SIGTERM)  # passed on to rank 0
        wait_for(lambda: not psutil.pid_exists(rank0), "rank 0 to die of its SIGTERM", 30)
        time.sleep(FAILURE_SETTLE_S + 1)  # the gap under test: past the old settle time
        os.kill(worker1, signal.SIGKILL)

    cutter = threading.Thread(target=cut_after_stop, daemon=True)
    cutter.start()
    with pytest.raises(RankFailedError) as failed:
        runner.run(wait_named, directory=str(tmp_path))
    cutter.join(timeout=60)
    assert "python" in " ".join(outcome["worker"]), outcome
    first = str(failed.value).splitlines()[0]
    assert "lost contact with Spark task 1" in first, str(failed.value)
    assert failed.value.rank == 1
    assert_nothing_left(runner)


def waits_here(directory: str) -> int:
    """Write this rank's pid and its supervisor's, then wait (the test ends the job)."""
    return wait_named(directory)


def test_a_lost_task_leaves_the_other_ranks_stacks_for_a_relayed_client(sc, tmp_path):
    """Relay mode's supervisors (`LEFT_STACKS`, given here through `env`): task 1's Python
    worker SIGKILLed first (as Spark cancelling a relayed stage may, seconds before task
    0's), the job's service sees the lost contact and aborts the job; rank 0's supervisor
    leaves its rank's stacks on its host for the client, which may get no answer from the
    cancelled stage (before, an abort removed them: rank 0 left no stacks)."""
    job_id = f"test-{os.getpid()}"  # the files' name: the job the client would collect
    prefix = left_stacks.job_prefix(job_id)
    env = {job_environment.LEFT_STACKS: prefix}
    runner = HorovodRunner(np=2, launcher="direct", max_failures=0, start_timeout=120, env=env)

    def lose_task_1() -> None:
        named = [tmp_path / "rank-0", tmp_path / "rank-1"]
        wait_for(lambda: all(p.exists() for p in named), "both ranks to start")
        _, supervisor1 = _pids(named[1])
        os.kill(psutil.Process(supervisor1).ppid(), signal.SIGKILL)  # task 1's worker

    cutter = threading.Thread(target=lose_task_1, daemon=True)
    cutter.start()
    try:
        with pytest.raises(RankFailedError) as failed:
            runner.run(waits_here, directory=str(tmp_path))
        cutter.join(timeout=60)
        assert "lost contact with Spark task 1" in str(failed.value).splitlines()[0]
        left = {rank: text for rank, _, text, _ in left_stacks.entries(_collected(job_id))}
    finally:
        for path in glob.glob(f"{prefix}*"):
            os.unlink(path)
    assert "waits_here" in left.get(0, ""), left
    assert_nothing_left(runner)


def _collected(job_id: str) -> bytes:
    """The files left for `job_id` (as the client's collecting task reads them), once
    rank 0's is there (its supervisor leaves it as the job is aborted)."""
    rank0 = f"{left_stacks.job_prefix(job_id)}rank0"
    wait_for(lambda: os.path.exists(rank0), "rank 0's stacks to be left", 30)
    return left_stacks.collect(job_id)
