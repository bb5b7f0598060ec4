"""The driver's record of a job's trace (`sparkdist/trace/recorder.py`) and a rank's half
(`sparkdist/protocol/rank_trace.py`), without a job: lanes merge past their limit and
keep what the picture reads (steps counted, waits summed), a long wide job stays under
the size cap, and a rank's clock maps onto the driver's."""

from __future__ import annotations

import json
import time

from sparkdist.protocol import rank_trace
from sparkdist.trace import format, validate
from sparkdist.trace.recorder import JobTrace, Lane


def test_a_lane_past_its_limit_merges_and_keeps_every_step():
    lane = Lane(format.STEPS, limit=64)
    for step in range(1000):
        lane.add(step * 10.0, 9.0, f"step {step}", {"steps": 1})
    assert len(lane.slices) <= 64
    assert sum(s[4]["steps"] for s in lane.slices) == 1000
    assert lane.slices[0][3] == f"steps 0-{lane.slices[0][4]['last']}"
    assert lane.slices[-1][4]["last"] == 999
    ends = [ts + dur for ts, dur, *_ in lane.slices]
    starts = [ts for ts, *_ in lane.slices]
    assert all(end <= start for end, start in zip(ends, starts[1:], strict=False))  # no overlap
    assert ends[-1] == 999 * 10.0 + 9.0  # a merged step spans its first to its last


def test_steps_back_to_back_on_a_rank_s_clock_merge_as_many_as_the_lane_says():
    """A step's start is the last one's end, converted apart: a float's error must not
    keep it from joining the last slice (half the steps did not, and the lane halved
    again and again)."""
    rank_trace.start(0.0, 0.0, 0.0)
    try:
        rank_trace.main_entered()
        for _ in range(10_000):
            rank_trace.step("report")
        events = rank_trace.drain()
    finally:
        rank_trace.start(-1.0, 0.0, 0.0)
    trace = JobTrace("j")
    trace.rank_events(0, events)
    lane = trace.ranks[0].lanes[format.STEPS]
    assert lane.per_slice == 16  # 10,000 steps in at most 1,024 slices: 16 a slice
    assert sum(s[4]["steps"] for s in lane.slices) == 10_000
    assert len(lane.slices) == -(-10_000 // 16)


def test_merged_waits_keep_their_summed_time_inside_their_span():
    lane = Lane(format.DATA_WAIT, limit=16)
    for i in range(500):
        lane.add(i * 10.0, 2.0, "data wait", {"waits": 1})
    assert len(lane.slices) <= 16
    assert sum(s[1] for s in lane.slices) == 1000.0  # 500 waits of 2 µs
    assert sum(s[4]["waits"] for s in lane.slices) == 500
    for (ts, dur, *_), (next_ts, *_) in zip(lane.slices, lane.slices[1:], strict=False):
        assert ts + dur <= next_ts


def _long_wide_job(ranks: int, steps: int) -> JobTrace:
    trace = JobTrace("big", "train")
    trace.attempt_started(0, "start", 1)
    trace.world(ranks, None, "start")
    for rank in range(ranks):
        trace.rank_connected(rank, f"host-{rank % 8}")
        events = [("main", 0, "main", 1000.0, 0.0, None)]
        for step in range(steps):
            ts = 2000.0 + step * 1000.0
            events.append(("X", format.DATA_WAIT, "data wait", ts, 50.0, {"waits": 1}))
            events.append(("X", format.STEPS, f"step {step}", ts, 900.0, {"steps": 1}))
            events.append(("X", format.CHECKPOINT, "commit", ts + 900, 20.0, {"count": 1}))
        trace.rank_events(rank, events)
        trace.rank_ended(rank, "returned")
    trace.attempt_ended("succeeded")
    return trace


def test_ten_thousand_steps_at_np_64_stay_under_the_cap():
    trace = _long_wide_job(64, 10_000).to_dict()
    size = len(json.dumps(trace, separators=(",", ":")))
    assert size <= format.SIZE_CAP_BYTES, size
    validate.check(trace)
    steps = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == format.STEPS]
    assert sum(e["args"]["steps"] for e in steps if e["pid"] == 1) == 10_000
    waits = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == format.DATA_WAIT]
    assert sum(e["dur"] for e in waits if e["pid"] == 1) == 10_000 * 50.0


def test_a_rank_s_first_end_counts_and_a_failure_is_an_instant_on_its_track():
    trace = JobTrace("j")
    trace.attempt_started(0, "start", 1)
    trace.rank_connected(1, "h")
    trace.rank_events(1, [("main", 0, "main", trace.now_us(), 0.0, None)])
    trace.rank_ended(1, "failed", "raised ValueError: bad")
    trace.rank_ended(1, "failed", "exited with code 1")  # its exit, after its error
    trace.attempt_ended("failed")
    events = trace.to_dict()["traceEvents"]
    failures = [e for e in events if e["name"] == "failure"]
    assert [(e["pid"], e["args"]["reason"]) for e in failures] == [(2, "raised ValueError: bad")]
    (main,) = [e for e in events if e["name"] == "main"]
    assert main["args"]["ended"] == "failed"


def test_malformed_rank_events_are_dropped():
    trace = JobTrace("j")
    trace.rank_events(0, [("X",), None, ("X", 2, 5, "ts", 0, None), ("X", 99, "x", 1, 1, None)])
    trace.rank_events(0, [("X", format.STEPS, "step 0", 10.0, 5.0, {"steps": 1})])
    steps = [e for e in trace.to_dict()["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in steps] == ["step 0"]


def test_a_rank_maps_its_clock_to_the_driver_s_at_its_hello():
    asked = time.monotonic()
    answered = asked + 0.002  # a 2 ms round trip; the driver's clock read 5 s mid-way
    rank_trace.start(5_000_000.0, asked, answered)
    try:
        rank_trace.span(format.CHECKPOINT, "save", asked + 1.001, asked + 1.501)
        (event,) = rank_trace.drain()
        assert event[:3] == ("X", format.CHECKPOINT, "save")
        assert abs(event[3] - 6_000_000.0) < 1.0 and abs(event[4] - 500_000.0) < 1.0
    finally:
        rank_trace.start(-1.0, 0.0, 0.0)
    assert not rank_trace.recording()
    rank_trace.span(format.CHECKPOINT, "save", 0.0, 1.0)  # not recording: nothing kept
    assert rank_trace.drain() == []


def test_a_rank_s_steps_come_from_its_first_kind_and_short_waits_are_not_waits():
    rank_trace.start(0.0, time.monotonic(), time.monotonic())
    try:
        rank_trace.main_entered()
        rank_trace.step("report", 7)
        rank_trace.step("commit")  # reports are this rank's steps: a commit is not another
        rank_trace.step("report")
        now = time.monotonic()
        rank_trace.data_wait(now, now + rank_trace.DATA_WAIT_MIN_S / 2)
        rank_trace.data_wait(now, now + 0.01)
        names = [(e[0], e[2]) for e in rank_trace.drain()]
    finally:
        rank_trace.start(-1.0, 0.0, 0.0)
    assert names == [("main", "main"), ("X", "step 7"), ("X", "step 8"), ("X", "data wait")]


def test_slices_that_meet_never_overlap_once_rounded():
    """A step's end and the next one's start are the same instant converted apart: a
    float's error rounds them 0.1 µs apart (seen in a 10,000-step job's trace)."""
    lane = Lane(format.STEPS)
    lane.add(9778221.2, 4988.751, "step 1", {"steps": 1})  # ends at 9783209.951: rounds up
    lane.add(9783209.949, 7792.0, "step 2", {"steps": 1})  # starts 2 ns before: rounds down
    first, second = lane.events(1)
    assert first["ts"] + first["dur"] <= second["ts"]
