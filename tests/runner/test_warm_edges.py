"""Warm worlds' edges (issue 64), on real Spark (local-cluster, the session's two
executors) with real ranks:

* a warm elastic world that relaunches mid-run (a rank SIGKILLed) watches its new ranks
  for stalls: one that goes silent gets the run's stall warning, then its stall timeout
  (before, the watch kept watching the first attempt's ranks, and the run only ended at
  its `timeout`).

A host lost while a warm world is idle: `test_warm_idle_loss.py`.
"""

from __future__ import annotations

import logging
import os
import time

import pytest
from helpers import pid_alive, wait_for

from sparkdist import HorovodRunner, JobStalledError

STALL_WARNING_S = 4
STALL_TIMEOUT_S = 10
RUN_TIMEOUT_S = 90


def silent_after_relaunch(marker: str) -> int:
    """First attempt: launch rank 0 dies of SIGKILL (its peer waits, silent, to be
    stopped). The relaunched attempt: rank 1 prints a line (its start ends there: a rank
    that never spoke is starting, `stalls.StallClock`), writes `marker` and waits for ever
    in silence; rank 0 returns."""
    import signal
    import threading

    from sparkdist import checkpoint

    rank = os.environ["RANK"]
    if checkpoint.attempt() == 0:
        if rank == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Event().wait()
    if rank == "1":
        print("waiting", flush=True)
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
        threading.Event().wait()
    return os.getpid()


def test_a_warm_world_relaunched_mid_run_watches_its_new_ranks_for_stalls(sc, tmp_path, caplog):
    marker = tmp_path / "silent"
    # min_np=2: the stall cannot drop rank 1 and relaunch without it (the relaunch path's
    # drop of a stopped rank), so the stall timeout ends the run.
    options = dict(np=2, min_np=2, max_np=2, launcher="direct", keep_warm=120)
    limits = dict(stall_warning=STALL_WARNING_S, stall_timeout=STALL_TIMEOUT_S)
    with HorovodRunner(**options, start_timeout=120, timeout=RUN_TIMEOUT_S, **limits) as runner:
        with caplog.at_level(logging.WARNING, logger="sparkdist"):
            with pytest.raises(JobStalledError) as stalled:
                runner.run(silent_after_relaunch, marker=str(marker))
        silent_for = time.time() - marker.stat().st_mtime
    # Its stall timeout, the watch's tick, the stacks' wait; not the run's time limit.
    assert STALL_TIMEOUT_S <= silent_for < STALL_TIMEOUT_S + 30, silent_for
    assert "stall_timeout=10" in str(stalled.value)
    assert "silent_after_relaunch" in str(stalled.value)  # rank 1's stacks
    warned = [r.getMessage() for r in caplog.records if "stall_warning=4" in r.getMessage()]
    assert warned, caplog.text
    wait_for(lambda: not pid_alive(int(marker.read_text())), "the silent rank to stop", 30)
