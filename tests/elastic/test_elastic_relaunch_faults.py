"""Faults an elastic job on the relaunch path (no `sparkdist.elastic.run`) survives as it
does in process (issue 64, found by the chaos soak's relaunch mode):

* a rank that stops without dying (SIGSTOPped): with a `stall_timeout` given, the stall
  watch names it silent and kills it, and the job relaunches from its checkpoint (before:
  the whole job failed with `JobStalledError`);
* a rank that ends non-zero without an exception of its own (`os._exit(3)`) is a lost
  rank: the job relaunches (before: it failed as if the training code had raised).

On the session's local-cluster: a world of four (two ranks per task) doing a gloo
`all_reduce` and a driver-path checkpoint a step; launch rank 3 stops at step 5 of the
first attempt. The ranks print a line a second until their group forms (importing torch
takes seconds, in silence, on a loaded machine: the short `stall_timeout` counts from the
stall).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

import stall_jobs
from helpers import assert_nothing_left

import sparkdist

STALL_TIMEOUT_S = 8
STOP_AT = 5
STEPS = 12


def stop_once(out: str, how: str) -> dict:
    """Steps of an all_reduce, each checkpointed; at step `STOP_AT` of the first attempt
    launch rank 3 SIGSTOPs itself (`how="sigstop"`) or calls `os._exit(3)`."""
    started = threading.Event()
    threading.Thread(target=stall_jobs._beat_until, args=(started,), daemon=True).start()
    import torch
    import torch.distributed as dist

    from sparkdist import checkpoint

    dist.init_process_group("gloo")
    started.set()
    rank, attempt = dist.get_rank(), checkpoint.attempt()
    found = checkpoint.resume()
    step = found.step if found else 0
    value = torch.ones(1)
    while step < STEPS:
        if step == STOP_AT and rank == 3 and attempt == 0:
            Path(out, "stopped").write_text(str(time.time()))
            if how == "sigstop":
                os.kill(os.getpid(), signal.SIGSTOP)
            os._exit(3)
        dist.all_reduce(value)
        step += 1
        checkpoint.save({"step": step}, step)
        time.sleep(0.02)
    size = dist.get_world_size()
    dist.destroy_process_group()
    return {
        "rank": rank,
        "size": size,
        "step": step,
        "attempt": attempt,
        "from": found.step if found else 0,
    }


def run_stopping(out: Path, how: str, caplog) -> tuple:
    runner = sparkdist.HorovodRunner(
        np=4, min_np=2, max_np=4, ranks_per_task=2, stall_timeout=STALL_TIMEOUT_S
    )
    with caplog.at_level(logging.WARNING, logger="sparkdist"):
        results = runner.run_all(stop_once, out=str(out), how=how)
    print(f"{how}: {time.time() - float((out / 'stopped').read_text()):.1f} s to the job's end")
    log = "\n".join(record.getMessage() for record in caplog.records)
    return runner, results, log


def assert_relaunched(runner, results) -> None:
    """One relaunch for rank 3, resumed from the checkpoint of the step it stopped at."""
    assert sorted(r["rank"] for r in results) == [0, 1, 2, 3], results
    assert all(r["step"] == STEPS and r["attempt"] == 1 for r in results), results
    assert all(r["from"] == STOP_AT for r in results), results  # nothing redone
    job = runner.last_job
    assert job.attempts == 2 and len(job.failures) == 1, job.failures
    assert "rank 3 on host " in job.failures[0], job.failures
    assert_nothing_left(runner)


def test_a_sigstopped_rank_is_killed_and_the_job_relaunches(sc, tmp_path, caplog):
    runner, results, log = run_stopping(tmp_path, "sigstop", caplog)
    assert_relaunched(runner, results)
    silent = [line for line in log.splitlines() if "is silent: no sign of life" in line]
    assert len(silent) == 1 and "rank 3 (host " in silent[0], log
    assert "It is killed; the job relaunches." in silent[0], silent
    assert "JobStalledError" not in log


def test_a_rank_that_exits_without_an_error_is_lost_and_the_job_relaunches(sc, tmp_path, caplog):
    runner, results, log = run_stopping(tmp_path, "exit", caplog)
    assert_relaunched(runner, results)
    assert "ended with exit code 3" in runner.last_job.failures[0], runner.last_job.failures
