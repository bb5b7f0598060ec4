"""Is a trace what `format.py` promises? Perfetto's trace processor cannot run where the
tests run (its Python package downloads its binary), so this stands in for it: the rules
of Chrome's Trace Event Format that viewers rely on, and sparkdist's own.

`problems(trace)` lists what is wrong (empty when nothing is); `check(trace)` raises
`ValueError` with every problem, for tests and for a recorder's own checks.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from sparkdist.trace import format

PHASES = ("X", "i", "C", "M")
"""The event kinds sparkdist writes: complete slices, instants, counters, metadata."""
METADATA = ("process_name", "process_sort_index", "thread_name", "thread_sort_index")
INSTANT_SCOPES = ("t", "p", "g")
REQUIRED = ("name", "ph", "ts", "pid", "tid")
EPSILON_US = 1e-3
"""Slices that meet end to start may overlap by a float's rounding (ts + dur written as
decimals): less than this is no overlap."""


def check(trace: Any) -> None:
    """Raise `ValueError` naming every problem of `trace`, if it has any."""
    found = problems(trace)
    if found:
        listed = "\n".join(f"  - {problem}" for problem in found)
        raise ValueError(f"the trace has {len(found)} problem(s):\n{listed}")


def problems(trace: Any) -> list[str]:
    """What is wrong with `trace` (a parsed trace.json), one line each; [] when valid."""
    if not isinstance(trace, dict):
        return [f"a trace is a JSON object (object form), not {type(trace).__name__}"]
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return ["the trace has no `traceEvents` list"]
    found = _version_problems(trace)
    well_formed = []
    for index, event in enumerate(events):
        event_problems = _event_problems(event)
        found += [f"{_where(index, event)}: {problem}" for problem in event_problems]
        if not event_problems:
            well_formed.append((index, event))
    found += _nesting_problems(well_formed)
    found += _naming_problems([event for _, event in well_formed])
    return found


def _version_problems(trace: dict) -> list[str]:
    other = trace.get("otherData")
    ours = other.get("sparkdist") if isinstance(other, dict) else None
    if not isinstance(ours, dict) or "version" not in ours:
        return ["no `otherData.sparkdist.version`: not a sparkdist trace"]
    if ours["version"] != format.VERSION:
        return [f"otherData.sparkdist.version is {ours['version']!r}, not {format.VERSION}"]
    return []


def _where(index: int, event: Any) -> str:
    """How a problem names its event: its index, and its kind and name when it has them."""
    if not isinstance(event, dict):
        return f"event {index}"
    return f"event {index} ({event.get('ph')} {event.get('name')!r})"


def is_number(value: Any) -> bool:
    """A JSON number that is finite (not a bool, not NaN): what ts, dur and counters hold."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _event_problems(event: Any) -> list[str]:
    """What is wrong with one event on its own (not against the others)."""
    if not isinstance(event, dict):
        return ["an event is a JSON object"]
    ph = event.get("ph")
    required = [key for key in REQUIRED if not (key == "ts" and ph == "M")]
    missing = [key for key in required if key not in event]
    if missing:
        return [f"missing {', '.join(missing)}"]
    if ph not in PHASES:
        return [f"ph {ph!r} is not one of {', '.join(PHASES)}"]
    found = []
    if not isinstance(event["name"], str):
        found.append("name is not a string")
    if "ts" in event and not is_number(event["ts"]):
        found.append(f"ts {event['ts']!r} is not a number")
    found += _id_problems(event)
    found += _KIND_CHECKS[ph](event)
    return found


def _id_problems(event: dict) -> list[str]:
    """pid: the driver's or a rank's (`format.rank_pid`); tid: an integer lane."""
    found = []
    pid, tid = event["pid"], event["tid"]
    if not isinstance(pid, int) or isinstance(pid, bool) or pid < format.DRIVER:
        found.append(f"pid {pid!r} is neither the driver's ({format.DRIVER}) nor a rank's")
    if not isinstance(tid, int) or isinstance(tid, bool):
        found.append(f"tid {tid!r} is not an integer")
    elif event["ph"] in ("X", "i") and isinstance(pid, int):
        lanes = format.DRIVER_LANES if pid == format.DRIVER else format.RANK_LANES
        if tid not in lanes:
            found.append(f"tid {tid} is not a lane of format.py's {sorted(lanes)}")
    return found


def _slice_problems(event: dict) -> list[str]:
    dur = event.get("dur")
    if not is_number(dur):
        return [f"an X slice needs a numeric dur, not {dur!r}"]
    if dur < 0:
        return [f"dur {dur} < 0"]
    return []


def _instant_problems(event: dict) -> list[str]:
    found = []
    if event.get("s") not in INSTANT_SCOPES:
        found.append(f"s {event.get('s')!r} is not one of {', '.join(INSTANT_SCOPES)}")
    if event["name"] not in format.INSTANTS:
        found.append("not an instant of format.INSTANTS")
    return found


def _counter_problems(event: dict) -> list[str]:
    found = []
    args = event.get("args")
    if not isinstance(args, dict) or not args:
        found.append("a counter needs args")
    elif not all(is_number(value) for value in args.values()):
        found.append(f"a counter's args are numbers, not {args!r}")
    if event["name"] not in format.COUNTERS:
        found.append("not a counter of format.COUNTERS")
    return found


def _metadata_problems(event: dict) -> list[str]:
    name, args = event["name"], event.get("args")
    if name not in METADATA:
        return [f"metadata is one of {', '.join(METADATA)}"]
    args = args if isinstance(args, dict) else {}
    value = args.get("name" if name.endswith("_name") else "sort_index")
    if name.endswith("_name") and not (isinstance(value, str) and value):
        return ["args.name is not a non-empty string"]
    if name.endswith("_sort_index") and not is_number(value):
        return ["args.sort_index is not a number"]
    return []


_KIND_CHECKS = {
    "X": _slice_problems,
    "i": _instant_problems,
    "C": _counter_problems,
    "M": _metadata_problems,
}


def _nesting_problems(events: list[tuple[int, dict]]) -> list[str]:
    """On one lane (pid, tid), two slices either do not overlap or one holds the other."""
    lanes = defaultdict(list)
    for index, event in events:
        if event["ph"] == "X":
            lanes[event["pid"], event["tid"]].append((event["ts"], event["dur"], index))
    found = []
    for (pid, tid), slices in sorted(lanes.items()):
        # By start, the longer first: a slice that holds others comes before them.
        slices.sort(key=lambda s: (s[0], -s[1], s[2]))
        open_slices: list[tuple[float, int]] = []  # (end, index), innermost last
        for ts, dur, index in slices:
            while open_slices and open_slices[-1][0] <= ts + EPSILON_US:
                open_slices.pop()
            if open_slices and ts + dur > open_slices[-1][0] + EPSILON_US:
                other = open_slices[-1][1]
                found.append(
                    f"event {index} overlaps event {other} on lane (pid {pid}, tid {tid}) "
                    "without nesting in it"
                )
                continue
            open_slices.append((ts + dur, index))
    return found


def _naming_problems(events: list[dict]) -> list[str]:
    """Every process with events is named (`process_name`), and so is every lane that
    holds slices or thread-scoped instants (`thread_name`)."""
    named_pids = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    named_lanes = {
        (e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"
    }
    used_pids = {e["pid"] for e in events if e["ph"] != "M"}
    used_lanes = {
        (e["pid"], e["tid"]) for e in events if e["ph"] == "X" or (e["ph"] == "i" and e["s"] == "t")
    }
    found = [f"pid {pid} has events but no process_name" for pid in sorted(used_pids - named_pids)]
    found += [
        f"lane (pid {pid}, tid {tid}) has events but no thread_name"
        for pid, tid in sorted(used_lanes - named_lanes)
    ]
    return found
