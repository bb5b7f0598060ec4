"""The trace validator (sparkdist/trace/validate.py): each rule on hand-made traces, and
random event streams (Hypothesis): valid ones pass, each kind of breakage is caught."""

from __future__ import annotations

import copy

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from traces import MS, counter, instant, job_trace, process, slice_

from sparkdist.trace import format
from sparkdist.trace.validate import check, problems

RANK0 = format.rank_pid(0)


def small_trace(*events: dict) -> dict:
    """The driver and rank 0 named (all their lanes), with `events`."""
    named = process(format.DRIVER, "driver", format.DRIVER_LANES)
    named += process(RANK0, "rank 0 (host)", format.RANK_LANES)
    return {
        "traceEvents": named + list(events),
        "otherData": {"sparkdist": {"version": format.VERSION}},
    }


def step(ts: int, dur: int, tid: int = format.STEPS, pid: int = RANK0) -> dict:
    return slice_(pid, tid, "step", ts, dur, steps=1)


def test_hand_made_jobs_are_valid():
    assert problems(job_trace([10, 30, 10])) == []
    trace = job_trace([5, 5], failures={1: "boom"}, gpu_mib={0: [10.0, 20.0]}, world=[(MS, 2)])
    assert problems(trace) == []
    check(trace)  # raises nothing


@pytest.mark.parametrize(
    "trace, expected",
    [
        ([], "a trace is a JSON object (object form), not list"),
        ({}, "the trace has no `traceEvents` list"),
        ({"traceEvents": {}}, "the trace has no `traceEvents` list"),
        ({"traceEvents": []}, "no `otherData.sparkdist.version`: not a sparkdist trace"),
        (
            {"traceEvents": [], "otherData": {"sparkdist": {"version": 99}}},
            f"otherData.sparkdist.version is 99, not {format.VERSION}",
        ),
    ],
)
def test_the_object_form_and_the_version(trace, expected):
    assert problems(trace) == [expected]


@pytest.mark.parametrize("key", ["name", "ph", "ts", "pid", "tid"])
def test_every_event_has_name_ph_ts_pid_and_tid(key):
    event = step(0, MS)
    del event[key]
    found = problems(small_trace(event))
    assert len(found) == 1 and found[0].endswith(f"missing {key}"), found


def test_metadata_needs_no_ts_but_its_name_and_value():
    unnamed = {"name": "thread_name", "ph": "M", "pid": RANK0, "tid": 9, "args": {}}
    timeless = {"name": "process_sort_index", "ph": "M", "pid": RANK0, "tid": 0}
    timeless["args"] = {"sort_index": 1}
    unknown = {"name": "process_labels", "ph": "M", "pid": RANK0, "tid": 0, "args": {}}
    found = problems(small_trace(unnamed, timeless, unknown))
    assert len(found) == 2
    assert "args.name is not a non-empty string" in found[0]
    assert "metadata is one of process_name" in found[1]


def test_fields_have_their_types():
    bad = [
        {**step(0, MS), "ts": "0"},
        {**step(0, MS), "ts": True},
        {**step(0, MS), "ts": float("nan")},
        {**step(0, MS), "name": 3},
        {**step(0, MS), "pid": -1},
        {**step(0, MS), "tid": "steps"},
        {**step(0, MS), "ph": "B"},
    ]
    found = problems(small_trace(*bad))
    assert [f.split(": ", 1)[1] for f in found] == [
        "ts '0' is not a number",
        "ts True is not a number",
        "ts nan is not a number",
        "name is not a string",
        "pid -1 is neither the driver's (0) nor a rank's",
        "tid 'steps' is not an integer",
        "ph 'B' is not one of X, i, C, M",
    ]


def test_slices_have_a_duration_of_zero_or_more():
    no_dur = step(0, MS)
    del no_dur["dur"]
    found = problems(small_trace(no_dur, step(2 * MS, -1), step(3 * MS, 0)))
    assert len(found) == 2
    assert found[0].endswith("an X slice needs a numeric dur, not None")
    assert found[1].endswith("dur -1 < 0")


def test_slices_nest_within_a_lane():
    nested = [step(0, 10 * MS, tid=format.LAUNCH), step(MS, 2 * MS, tid=format.LAUNCH)]
    touching = [step(0, MS), step(MS, MS), step(2 * MS, 0)]
    same = [step(5 * MS, MS, tid=format.CHECKPOINT), step(5 * MS, MS, tid=format.CHECKPOINT)]
    assert problems(small_trace(*nested, *touching, *same)) == []
    # On other lanes and other processes, slices may overlap freely.
    other_lane = step(int(1.5 * MS), MS, tid=format.DATA_WAIT)
    assert problems(small_trace(*touching, other_lane)) == []
    overlapping = small_trace(step(0, 2 * MS), step(MS, 2 * MS))
    found = problems(overlapping)
    assert len(found) == 1 and "without nesting" in found[0], found
    assert f"on lane (pid {RANK0}, tid {format.STEPS})" in found[0]


def test_instants_have_a_scope_and_a_known_kind():
    good = [instant(RANK0, "failure", 0, reason="x"), instant(format.DRIVER, "stacks", 0, "p")]
    assert problems(small_trace(*good)) == []
    no_scope = instant(RANK0, "notice", 0)
    del no_scope["s"]
    found = problems(small_trace(no_scope, instant(RANK0, "surprise", 0, "g")))
    assert [f.split(": ", 1)[1] for f in found] == [
        "s None is not one of t, p, g",
        "not an instant of format.INSTANTS",
    ]


def test_counters_have_numbers_and_a_known_kind():
    good = counter(RANK0, "gpu memory", 0, allocated_mib=1.5, reserved_mib=2)
    assert problems(small_trace(good)) == []
    found = problems(
        small_trace(
            counter(RANK0, "gpu memory", 0, allocated_mib="lots"),
            counter(RANK0, "gpu memory", 0),
            counter(RANK0, "temperature", 0, celsius=50),
        )
    )
    assert [f.split(": ", 1)[1] for f in found] == [
        "a counter's args are numbers, not {'allocated_mib': 'lots'}",
        "a counter needs args",
        "not a counter of format.COUNTERS",
    ]


def test_every_process_and_lane_is_named():
    trace = small_trace(step(0, MS, pid=format.rank_pid(4)))
    trace["traceEvents"].append(step(0, MS, tid=format.STEPS, pid=format.rank_pid(5)))
    trace["traceEvents"].append(process(format.rank_pid(5), "rank 5", {})[0])
    assert problems(trace) == [
        "pid 5 has events but no process_name",
        "lane (pid 5, tid 2) has events but no thread_name",
        "lane (pid 6, tid 2) has events but no thread_name",
    ]


def test_slices_and_instants_are_on_format_lanes():
    found = problems(small_trace(step(0, MS, tid=format.GENERATIONS + 40)))
    assert len(found) == 1
    assert found[0].endswith("tid 42 is not a lane of format.py's [1, 2, 3, 4, 5, 6]")
    on_driver = step(0, MS, tid=format.DATA_WAIT, pid=format.DRIVER)
    found = problems(small_trace(on_driver))
    assert found[0].endswith("tid 3 is not a lane of format.py's [1, 2, 5, 6]")


def test_check_raises_with_every_problem():
    with pytest.raises(ValueError) as raised:
        check(small_trace(step(0, -1), {**step(0, MS), "ph": "Q"}))
    message = str(raised.value)
    assert message.startswith("the trace has 2 problem(s):")
    assert "dur -1 < 0" in message and "ph 'Q' is not one of" in message


# --- random streams -------------------------------------------------------------------


@st.composite
def nested_slices(draw, lo: int, hi: int, depth: int = 0) -> list[tuple[int, int]]:
    """(ts, dur) slices inside [lo, hi] that never overlap without nesting: disjoint
    intervals from sorted cut points, each holding its own such slices."""
    cuts = sorted(draw(st.lists(st.integers(lo, hi), max_size=6)))
    found = []
    for start, end in zip(cuts[::2], cuts[1::2], strict=False):
        found.append((start, end - start))
        if depth < 3 and end > start:
            found += draw(nested_slices(start, end, depth + 1))
    return found


@st.composite
def valid_traces(draw) -> dict:
    """A job of 1 to 4 ranks: random nested slices on random lanes, instants and
    counters of format.py's kinds, in a random order."""
    ranks = draw(st.integers(1, 4))
    events = []
    pids = [format.DRIVER] + [format.rank_pid(r) for r in range(ranks)]
    for pid in pids:
        lanes = format.DRIVER_LANES if pid == format.DRIVER else format.RANK_LANES
        events += process(pid, "driver" if pid == format.DRIVER else f"rank {pid - 1}", lanes)
        for tid in draw(st.sets(st.sampled_from(sorted(lanes)), max_size=3)):
            for ts, dur in draw(nested_slices(0, 10_000)):
                events.append(slice_(pid, tid, "slice", ts, dur))
        for name in draw(st.lists(st.sampled_from(format.INSTANTS), max_size=3)):
            scope = draw(st.sampled_from(("t", "p", "g")))
            events.append(instant(pid, name, draw(st.integers(0, 10_000)), scope))
        for name in draw(st.lists(st.sampled_from(format.COUNTERS), max_size=2)):
            value = draw(st.floats(0, 1e6, allow_nan=False))
            events.append(counter(pid, name, draw(st.integers(0, 10_000)), value=value))
    events = draw(st.permutations(events))
    return {"traceEvents": events, "otherData": {"sparkdist": {"version": format.VERSION}}}


@settings(max_examples=150, deadline=None)
@given(valid_traces())
def test_random_valid_streams_validate(trace):
    assert problems(trace) == []


def _slices(trace: dict, min_dur: int = 0) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["dur"] >= min_dur]


def _break(trace: dict, how: str, data) -> bool:
    """Break one rule of `trace` in place; False when it has nothing to break that way."""
    events = trace["traceEvents"]
    if how == "overlap":
        # A new slice that starts inside one and ends after it: it cannot nest.
        inside = _slices(trace, min_dur=2)
        if not inside:
            return False
        s = data.draw(st.sampled_from(inside))
        ts = data.draw(st.integers(s["ts"] + 1, s["ts"] + s["dur"] - 1))
        end = s["ts"] + s["dur"] + data.draw(st.integers(1, 1000))
        events.append(slice_(s["pid"], s["tid"], "intruder", ts, end - ts))
    elif how == "negative dur":
        if not _slices(trace):
            return False
        data.draw(st.sampled_from(_slices(trace)))["dur"] = -data.draw(st.integers(1, 10**6))
    elif how == "missing key":
        timed = [e for e in events if e["ph"] != "M"]
        if not timed:
            return False
        del data.draw(st.sampled_from(timed))[data.draw(st.sampled_from(["name", "ph", "ts"]))]
    elif how in ("unnamed process", "unnamed lane"):
        used = {e["pid"] for e in events if e["ph"] != "M"}
        if how == "unnamed lane":
            used = {(e["pid"], e["tid"]) for e in events if e["ph"] == "X"}
        if not used:
            return False
        target = data.draw(st.sampled_from(sorted(used)))
        name = "process_name" if how == "unnamed process" else "thread_name"
        key = (lambda e: e["pid"]) if how == "unnamed process" else (lambda e: (e["pid"], e["tid"]))
        events[:] = [e for e in events if not (e["name"] == name and key(e) == target)]
    elif how == "bad scope":
        instants = [e for e in events if e["ph"] == "i"]
        if not instants:
            return False
        data.draw(st.sampled_from(instants))["s"] = data.draw(st.sampled_from(["x", "", None]))
    elif how == "text counter":
        counters = [e for e in events if e["ph"] == "C"]
        if not counters:
            return False
        data.draw(st.sampled_from(counters))["args"]["value"] = "high"
    elif how == "unknown kind":
        events.append(instant(format.DRIVER, "surprise", 0))
    return True


@settings(max_examples=200, deadline=None)
@given(valid_traces(), st.data())
def test_random_breakage_is_caught(trace, data):
    how = data.draw(
        st.sampled_from(
            [
                "overlap",
                "negative dur",
                "missing key",
                "unnamed process",
                "unnamed lane",
                "bad scope",
                "text counter",
                "unknown kind",
            ]
        )
    )
    broken = copy.deepcopy(trace)
    assume(_break(broken, how, data))
    assert problems(broken), how
