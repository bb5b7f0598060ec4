"""A stall in the job's trace (`stalls.StallWatch._trace_stall`), without a job: the
watch's ticks are driven by hand over signs of life set in the past, as a loaded machine
spaces them.

Before the fix both tests failed, as tests/trace/test_job_traces.py's stall test did on
a loaded machine. The second as it did once: "event 30 overlaps event 29 on lane (pid 1,
tid 5) without nesting in it". Rank 0 spoke (its last `Alive`) inside a stall, rank 1 a
moment after it, both before the watch's next tick: rank 0's silence was drawn to rank
1's sign, past its own, and the stall noticed in the job's tail drew rank 0 silent from
its own sign on, inside it. The first as it did with three CPU hogs beside it: every
stalls lane overlapped by 83.5 µs where the first stall met the second, each stall
mapped to the trace's clock by its own two readings of the clocks.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from sparkdist.runner.driver.job_spec import RunnerOptions
from sparkdist.runner.driver.stalls import SignsOfLife, StallWatch
from sparkdist.trace import format, validate
from sparkdist.trace.recorder import JobTrace


def watched_job(ranks: list[int]) -> StallWatch:
    """A stall watch (not started, `stall_warning=2`) over a job of `ranks`, all started
    and running, whose stacks nobody answers."""
    by_rank = {r: SimpleNamespace(started=True, exited=False) for r in ranks}
    records = SimpleNamespace(
        by_rank=by_rank,
        all_started=lambda: True,
        running=lambda: [r for r, s in by_rank.items() if not s.exited],
    )
    state = SimpleNamespace(
        cond=threading.Condition(),
        rank_records=records,
        membership=SimpleNamespace(min_np=None, left=[]),
        failures=SimpleNamespace(failed=[]),
        life=SignsOfLife(),
        trace=JobTrace("job"),
        stacks=SimpleNamespace(ask=lambda nccl=False: ({}, {})),
    )
    options = RunnerOptions(np=len(ranks), stall_warning=2)
    return StallWatch(state, options, "job", lambda text: None)


def spoke(life: SignsOfLife, rank: int, at: float) -> None:
    """Rank `rank` showed a sign of life at `at` (monotonic seconds, in the past)."""
    life.by_rank[rank] = at
    life.last = at


def slices(trace: dict, pid: int) -> list[tuple[float, float]]:
    """The (start, end) of each slice on `pid`'s stalls lane, in µs."""
    events = trace["traceEvents"]
    found = [e for e in events if e["ph"] == "X" and e["pid"] == pid and e["tid"] == format.STALLS]
    return [(e["ts"], round(e["ts"] + e["dur"], 1)) for e in found]


def test_a_stall_s_slices_map_the_watch_s_clock_to_the_trace_s_the_same_way_each_time():
    """Two stalls, one after the other: the second starts where the first ended on the
    driver and on each rank, to the µs (each was mapped by its own reading of the two
    clocks, and a thread switch between them moved a whole stall by milliseconds)."""
    watch = watched_job([0])
    life, base = watch.state.life, time.monotonic() - 60.0
    job_trace, late = watch.state.trace, [0.003]

    def now_us() -> float:  # the first reading 3 ms late: the watch's thread was switched out
        return JobTrace.now_us(job_trace) + (late.pop() * 1e6 if late else 0.0)

    spoke(life, 0, base)
    watch._tick()  # noticed: silent since `base`
    job_trace.now_us = now_us
    spoke(life, 0, base + 5.0)
    watch._tick()  # it spoke: traced; a new stall from its sign is noticed at once
    watch.__exit__(None, None, None)
    trace = watch.state.trace.to_dict()
    validate.check(trace)
    at = watch.state.trace.at_us
    for pid in (format.DRIVER, 1):
        first, second = slices(trace, pid)
        assert first == (pytest.approx(at(base), abs=0.1), pytest.approx(at(base + 5.0), abs=0.1))
        assert second[0] == first[1]


def test_a_rank_that_spoke_during_a_stall_is_silent_only_until_it_spoke():
    """Both ranks said "started" (0 at `base`, 1 half a second later) and went quiet;
    rank 0 spoke again at 4.5 s and rank 1 at 5 s, both before the watch's next tick; the
    job's tail was silent too. Rank 0's silences are `base` to 4.5 s and 4.5 s on, rank
    1's 0.5 s to 5 s and 5 s on: one after the other on each lane."""
    watch = watched_job([0, 1])
    life, base = watch.state.life, time.monotonic() - 60.0
    spoke(life, 0, base)
    spoke(life, 1, base + 0.5)
    watch._tick()  # noticed: the stall began at rank 1's line
    spoke(life, 0, base + 4.5)
    spoke(life, 1, base + 5.0)
    watch._tick()  # traced, and the job's silent tail noticed
    watch.__exit__(None, None, None)  # the job ended: the tail's stall ends now
    trace = watch.state.trace.to_dict()
    validate.check(trace)
    at = watch.state.trace.at_us
    for pid, last, again in ((1, base, base + 4.5), (2, base + 0.5, base + 5.0)):
        first, second = slices(trace, pid)
        assert first == (pytest.approx(at(last), abs=0.1), pytest.approx(at(again), abs=0.1))
        assert second[0] == first[1], (pid, first, second)
    stall = slices(trace, format.DRIVER)[0]
    assert stall == (pytest.approx(at(base + 0.5), abs=0.1), pytest.approx(at(base + 5.0), abs=0.1))
