"""Every job writes its trace (issue 63), on real Spark (local-cluster, the session's):

* np=3 ranks, rank 2 three times slower: its trace has each rank's launch phases (in
  order, on the driver's clock), its steps and its data waits; the picture names rank 2
  the slowest;
* a rank that raises: the failure instant is on that rank, with its reason;
* a job that stalls: the driver's stall slice, the ranks' silent slices, and the stacks
  instant on each rank that answered;
* `trace=False`: no file.

The in-process elastic world that shrinks and grows is traced in
tests/elastic/test_elastic_in_process.py (its world-size counter and generations).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from sparkdist import HorovodRunner
from sparkdist.errors import JobFailedError
from sparkdist.trace import format, validate
from sparkdist.trace.picture import Timeline

STEP_S = 0.02


def steps_on_batches(rows, slow_rank: int):
    """Each rank steps through its shard's batches, reporting each step; `slow_rank`'s
    steps take three times as long."""
    import os
    import time

    import sparkdist

    rank = int(os.environ["RANK"])
    step_s = STEP_S * (3 if rank == slow_rank else 1)
    with rows.make_numpy_batches(batch_size=20, num_epochs=1) as batches:
        for step, batch in enumerate(batches):
            time.sleep(step_s)  # the step's compute
            sparkdist.report({"rows": float(len(batch["x"]))}, step=step)
    return rank


@pytest.fixture(scope="module")
def rows(spark):
    frame = pd.DataFrame({"x": np.arange(600, dtype="float32"), "y": np.arange(600) % 3})
    return spark.createDataFrame(frame).repartition(3)


def _trace(job) -> dict:
    assert job.trace is not None
    with open(job.trace) as f:
        trace = json.load(f)
    validate.check(trace)
    return trace


def _slices(trace: dict, pid: int, lane: int) -> list[dict]:
    return [
        e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == pid and e["tid"] == lane
    ]


def test_a_slow_rank_is_named_slowest_and_every_rank_s_launch_steps_and_waits_are_traced(sc, rows):
    runner = HorovodRunner(np=3, ranks_per_task=3)
    assert runner.run(steps_on_batches, rows=rows, slow_rank=2) == 0
    trace = _trace(runner.last_job)
    assert trace["otherData"]["sparkdist"]["job_id"] == runner.last_job.job_id
    for rank in range(3):
        pid = format.rank_pid(rank)
        launch = _slices(trace, pid, format.LAUNCH)
        assert [s["name"] for s in launch] == ["scheduled", "starting", "loading", "main"]
        for before, after in zip(launch, launch[1:], strict=False):
            assert before["ts"] + before["dur"] <= after["ts"] + 0.2  # one after another
        steps = _slices(trace, pid, format.STEPS)
        assert sum(s["args"]["steps"] for s in steps) == 10  # 200 rows in batches of 20
        assert _slices(trace, pid, format.DATA_WAIT), f"rank {rank} never waited for data"
        (main,) = [s for s in launch if s["name"] == "main"]
        assert main["ts"] <= steps[0]["ts"] + 0.2 and steps[-1]["ts"] <= main["ts"] + main["dur"]
    timeline = Timeline(trace)
    assert timeline.slowest_rank == 2
    shares = {r.rank: r.data_wait_share for r in timeline.ranks}
    assert all(0 < share < 1 for share in shares.values()), shares


def raises_on_rank_1():
    import os

    if os.environ["RANK"] == "1":
        raise ValueError("rank 1 cannot go on")
    return "done"


def test_a_rank_that_raises_has_its_failure_on_its_own_track(sc):
    runner = HorovodRunner(np=2, ranks_per_task=2)
    with pytest.raises(JobFailedError):
        runner.run(raises_on_rank_1)
    trace = _trace(runner.last_job)
    # Rank 1's failure comes first. Rank 0 may have been stopped with the job (no failure
    # of its own), or ended by mpirun before the driver stopped it (a failure, later).
    first, *later = sorted(
        (e for e in trace["traceEvents"] if e["name"] == "failure"), key=lambda e: e["ts"]
    )
    assert first["pid"] == format.rank_pid(1), [first, *later]
    assert "ValueError: rank 1 cannot go on" in first["args"]["reason"]
    assert [e["pid"] for e in later] in ([], [format.rank_pid(0)]), later
    assert trace["otherData"]["sparkdist"]["outcome"] == "failed"


def silent_then_done(out: str):
    """Every rank says it started, goes quiet for 4 s (no output, no report), then
    returns."""
    import time

    print("started", flush=True)
    time.sleep(4)
    return "done"


def test_a_stall_shows_on_the_driver_and_on_each_silent_rank_with_its_stacks(sc, tmp_path):
    runner = HorovodRunner(np=2, ranks_per_task=2, stall_warning=2)
    assert runner.run(silent_then_done, out=str(tmp_path)) == "done"
    trace = _trace(runner.last_job)
    # One stall at least (the ranks may start, and so speak, seconds apart: two).
    stalls = _slices(trace, format.DRIVER, format.STALLS)
    assert stalls and all("no sign of life" in s["args"]["why"] for s in stalls), stalls
    assert max(s["dur"] for s in stalls) >= 2e6
    stacks = [e for e in trace["traceEvents"] if e["name"] == "stacks" and e["ph"] == "i"]
    # On the driver, and on each rank whose stacks came back in time (on a loaded
    # machine one may not answer within the wait).
    pids = {e["pid"] for e in stacks}
    assert format.DRIVER in pids and pids <= {format.DRIVER, 1, 2}, stacks
    for pid in (1, 2):
        silent = _slices(trace, pid, format.STALLS)
        assert silent and {s["name"] for s in silent} == {"silent"}, (pid, silent, stalls)
        assert max(s["dur"] for s in silent) >= 2e6, (pid, silent, stalls)


def returns_rank():
    import os

    return int(os.environ["RANK"])


def test_no_trace_when_turned_off(sc):
    runner = HorovodRunner(np=2, ranks_per_task=2, trace=False)
    assert runner.run(returns_rank) == 0
    assert runner.last_job.trace is None
    with pytest.raises(ValueError, match="trace=True"):
        runner.last_job.timeline()
