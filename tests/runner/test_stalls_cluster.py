"""A job that hangs or crawls on the cluster says where each rank is (issue 48).

The np=3 cases (an in-process elastic job among them) need three task slots: they run
in one child process on its own `local-cluster[3,3,1024]` (tests/stalls_cluster_child.py),
all in one Spark session. The data loader case runs at np=2 on the test session's shared Spark."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import stall_jobs

from sparkdist import HorovodRunner

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).parents[1] / "stalls_cluster_child.py"


CHILD_LIMIT_S = 480
"""The child's own limit, under pytest-timeout's 600 s for the test that sets the module's
fixture up (pyproject.toml), so that a child that overran shows its output (its runs took
104-205 s)."""


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    """Every np=3 scenario's outcome (one child process, one Spark session)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(tmp_path_factory.mktemp("stalls"))],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its Spark JVM and ranks in its process group
    )
    try:
        stdout, stderr = child.communicate(timeout=CHILD_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the child's group: what it started
        stdout, stderr = child.communicate()
        pytest.fail(f"the child ran past {CHILD_LIMIT_S} s:\n{(stdout + stderr)[-6000:]}")
    proc = subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)
    output = proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, output[-6000:]
    return json.loads(lines[-1][len("RESULT ") :]), output


@pytest.mark.parametrize("launcher", ["direct", "mpi"])
def test_a_time_limit_names_the_stuck_function_and_all_reduce(scenarios, launcher):
    outcome = scenarios[0][launcher]
    assert outcome["error"] == "JobTimeoutError", outcome
    where = outcome["stacks"]
    assert re.search(
        r"ranks 0,2 \(hosts? [^)]+\): all_reduce <- lock_job \(stall_jobs\.py:\d+\)", where
    ), where
    assert re.search(r"rank 1 \(host [^)]+\): stuck \(stall_jobs\.py:\d+\) <- lock_job", where), (
        where
    )
    assert where in outcome["message"] and outcome["left"] == []


def test_a_stall_timeout_fails_20_to_40s_after_the_stall_with_the_stacks(scenarios):
    """`stall_timeout=20`, counted from the stall (rank 1 stopped at its lock, the others'
    last lines just before), not from the job's start: the error comes no sooner than
    20 s after it (the silence is what ends the job, not a time limit), and within 40 s
    (20 s for the watch's tick, the stacks' wait and stopping the ranks under load: the
    stall watch, not the end of the test, ended the job)."""
    outcome = scenarios[0]["stall_timeout"]
    assert outcome["error"] == "JobStalledError", outcome
    assert outcome["after_stuck"] is not None, outcome  # it stalled at the lock
    assert 20 - 1 <= outcome["after_stuck"] < 40, outcome
    assert (
        "stuck (stall_jobs.py:" in outcome["stacks"]
        and "all_reduce <- lock_job" in outcome["stacks"]
    )
    assert outcome["left"] == []


def test_a_stall_warning_shows_the_stacks_and_the_job_goes_on(scenarios):
    outcome = scenarios[0]["stall_warning"]
    assert outcome["result"] == [0, 1, 2]
    warning = next(text for text in outcome["said"] if "stuck (stall_jobs.py" in text)
    assert "stall_warning=10" in warning and "stuck (stall_jobs.py:" in warning
    assert "all_reduce <- lock_job" in warning


def test_an_elastic_job_drops_its_stalled_rank_with_the_stacks_and_goes_on(scenarios):
    """`sparkdist.elastic.run` at np=3 (min_np=2): launch rank 1 blocks in the user's code
    inside the training function, the others wait in all_reduce, commits stop. At the 6 s
    `stall_timeout` the stuck rank is named silent with every rank's stacks, killed, and
    the world goes on as 2 (issue 64); its task's slot goes back to Spark (the world may
    grow back into it before the job's last step). The job ends well, nothing left."""
    outcome = scenarios[0]["elastic"]
    result = outcome["result"]
    assert sorted(result) == list(range(len(result))) and len(result) in (2, 3), outcome
    said = "\n".join(outcome["said"])
    silent = r"rank 1 \(host [^)]+\) is silent: no sign of life for \d+s \(stall_timeout=6\)"
    assert re.search(silent, said), said
    assert re.search(r"ranks 0,2 \(host [^)]+\): all_reduce <- train \(stall_jobs\.py:\d+\)", said)
    assert re.search(r"rank 1 \(host [^)]+\): stuck \(stall_jobs\.py:\d+\) <- train \(", said)
    assert "world 3 -> 2 ranks in process: rank 1 on host" in said, said
    assert "its slot goes back to Spark" in said, said
    assert outcome["left"] == []


def test_a_straggler_is_named_with_its_host_and_even_ranks_are_not(scenarios):
    slow = scenarios[0]["straggler"]
    named = [note for note in slow["stragglers"] if "is a straggler" in note]
    assert len(named) == 1 and re.match(r"rank 1 \(host [^)]+\) is a straggler: ", named[0]), slow
    assert slow["slow_steps_when_named"] is not None and slow["slow_steps_when_named"] <= 30, slow
    assert scenarios[0]["even"]["stragglers"] == []


def test_a_blocked_data_loader_shows_the_reader_thread(spark, tmp_path):
    """Rank 1's reader never returns (until the test removes the lock on the warning
    that shows it): its main thread waits for a batch, its reader thread is named."""
    lock = tmp_path / "lock"
    lock.touch()
    said = []

    class Release(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())
            if "<- hang (stall_jobs.py" in said[-1] and lock.exists():
                lock.unlink()  # a warning may come while torch imports: only this one counts

    handler = Release()
    logging.getLogger("sparkdist").addHandler(handler)
    try:
        df = spark.range(64).selectExpr("cast(id as float) as x")
        runner = HorovodRunner(np=2, launcher="direct", stall_warning=8)
        batches = runner.run_all(stall_jobs.blocked_loader, data=df, lock_file=str(lock))
    finally:
        logging.getLogger("sparkdist").removeHandler(handler)
    assert batches == [8, 8]
    where = next(text for text in said if "<- hang (stall_jobs.py" in text)
    assert re.search(r"rank 1 \(host [^)]+\): \w+ <- blocked_loader \(stall_jobs\.py:\d+\)", where)
    assert re.search(r"thread: stuck \(stall_jobs\.py:\d+\) <- hang \(stall_jobs\.py", where)
