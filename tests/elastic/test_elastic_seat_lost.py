"""A task seated into an elastic world whose executor is lost before it reaches the job's
service is a lost task (issue 64, found by the chaos soak's relaunch mode): the job
relaunches with the slots there are. Before, nothing noticed it: the attempt waited its
`start_timeout` for the task's ranks and failed the job with `JobTimeoutError`, which is
never relaunched.

On the session's local-cluster (two one-core executors): an elastic job of 1..2 ranks
whose gang has both tasks checked in; as the driver logs the world it forms (after it
chose the tasks, before it seats them) the test SIGKILLs one executor's JVM and every
process under it, so that one chosen task dies before it hears of its seat. Spark's
standalone master starts an executor in its place, for the tests after this one.
"""

from __future__ import annotations

import logging
import os
import signal
import time

import psutil
from helpers import still_alive

import sparkdist

START_TIMEOUT_S = 300
"""High, so that a seated task left waiting shows as a job that takes this long."""


def where() -> dict:
    """Which rank of which world, in which attempt."""
    from sparkdist import checkpoint

    return {
        "rank": int(os.environ["RANK"]),
        "size": int(os.environ["WORLD_SIZE"]),
        "attempt": checkpoint.attempt(),
    }


def kill_an_executor() -> int:
    """SIGKILL the newest executor JVM under this process, and every process under it;
    its pid."""
    executors = [p for p in psutil.Process().children(recursive=True) if _is_executor(p)]
    executor = max(executors, key=lambda p: p.create_time())
    for process in [*executor.children(recursive=True), executor]:
        process.send_signal(signal.SIGKILL)
    return executor.pid


def _is_executor(process: psutil.Process) -> bool:
    try:
        return "CoarseGrainedExecutorBackend" in " ".join(process.cmdline())
    except psutil.Error:  # ended meanwhile, or a zombie
        return False


class _KillAsSeated(logging.Handler):
    """Kills an executor when the first world of two forms (logged before its seats)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.killed: int | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.killed is None and "world 0 -> 2 ranks" in record.getMessage():
            self.killed = kill_an_executor()


def test_a_task_lost_as_it_is_seated_relaunches_the_job(sc, tmp_path):
    handler = _KillAsSeated()
    gang_log = logging.getLogger("sparkdist.runner.driver.launch.gang_kind")
    gang_log.addHandler(handler)
    runner = sparkdist.HorovodRunner(np=2, min_np=1, max_np=2, start_timeout=START_TIMEOUT_S)
    began = time.monotonic()
    try:
        results = runner.run_all(where)
    finally:
        gang_log.removeHandler(handler)
    took = time.monotonic() - began
    print(f"executor {handler.killed} killed as seated; the job took {took:.1f} s")
    assert handler.killed is not None
    job = runner.last_job
    assert job.attempts == 2 and len(job.failures) == 1, job.failures
    assert "lost contact with Spark task" in job.failures[0], job.failures
    assert results and all(r["attempt"] == 1 for r in results), results
    assert sorted(r["rank"] for r in results) == list(range(results[0]["size"])), results
    assert took < START_TIMEOUT_S / 3, took
    assert still_alive(runner) == []
