"""The driver's record of a job's trace: its own events and the ranks', kept small
enough to write at the end (`format.py` says what the file holds).

One `JobTrace` per job (`HorovodRunner.run`), across its attempts. The driver's service,
its launch and its watch call it as things happen; the ranks' events arrive with their
signs of life (`sparkdist/protocol/rank_trace.py`), already on the driver's clock. Each
lane keeps at most `MAX_SLICES_PER_LANE` slices: past that, neighbours merge two by two,
so a long job's trace stays the same size while its early steps blur (`Lane`).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterable
from typing import Any

from sparkdist.trace.format import (
    CHECKPOINT,
    DATA_WAIT,
    DRIVER,
    DRIVER_LANES,
    EVENTS,
    FILE_NAME,
    GENERATIONS,
    JOB,
    LAUNCH,
    MAX_SLICES_PER_LANE,
    RANK_LANES,
    SIZE_CAP_BYTES,
    STALLS,
    STEPS,
    VERSION,
    rank_pid,
)

SUMMED = (DATA_WAIT, CHECKPOINT)
"""Lanes whose merged slices keep the summed time (a rank's share of waiting), placed
at the first one's start, rather than the span from first to last."""
MAX_POINTS = 1024
"""Instants and counter samples kept per process: past that, every second one goes."""


class Lane:
    """One lane's slices, `[ts, dur, count, name, args]` each, in time order. Past `limit`
    slices, neighbours merge two by two and each later slice takes in twice as many
    (a slice that starts where the last ended, to within 1 µs of float error, joins it)."""

    def __init__(self, lane: int, limit: int = MAX_SLICES_PER_LANE):
        self.lane, self.limit = lane, limit
        self.summed = lane in SUMMED
        self.slices: list[list] = []
        self.per_slice = 1
        """How many recorded slices one kept slice may hold now."""

    def add(self, ts: float, dur: float, name: str, args: dict | None) -> None:
        last = self.slices[-1] if self.slices else None
        if last is not None and last[2] < self.per_slice and ts >= last[0] + last[1] - 1.0:
            self._merge(last, [ts, dur, 1, name, dict(args or {})])
            return
        self.slices.append([ts, max(dur, 0.0), 1, name, dict(args or {})])
        if len(self.slices) > self.limit:
            self.halve()

    def halve(self) -> None:
        """Merge neighbours two by two: half the slices, each holding twice as many."""
        merged = []
        for i in range(0, len(self.slices), 2):
            first = self.slices[i]
            if i + 1 < len(self.slices):
                self._merge(first, self.slices[i + 1])
            merged.append(first)
        self.slices = merged
        self.per_slice *= 2

    def _merge(self, into: list, other: list) -> None:
        if self.summed:
            into[1] += other[1]
        else:
            into[1] = other[0] + other[1] - into[0]
        into[2] += other[2]
        first, last = into[4].pop("first", None), other[4].get("last")
        for key, value in other[4].items():
            if key in ("first", "last"):
                continue
            numeric = isinstance(value, (int, float)) and isinstance(
                into[4].get(key, 0), (int, float)
            )
            into[4][key] = into[4].get(key, 0) + value if numeric else value
        if self.lane == STEPS:
            into[4]["first"] = _step_number(into[3]) if first is None else first
            into[4]["last"] = _step_number(other[3]) if last is None else last
            into[3] = f"steps {into[4]['first']}-{into[4]['last']}"
        elif other[3] != into[3] and self.lane == CHECKPOINT:
            into[3] = "checkpoint"

    def events(self, pid: int) -> list[dict]:
        """Its slices as trace events, in µs to one decimal. A slice's end and the next
        one's start, the same instant taken apart, may round 0.1 µs apart: the end is
        then the next start, so that one-after-another slices never overlap."""
        bounds = [(round(ts, 1), round(ts + dur, 1)) for ts, dur, *_ in self.slices]
        out = []
        for i, (_, _, _, name, args) in enumerate(self.slices):
            start, end = bounds[i]
            if i + 1 < len(bounds) and start <= bounds[i + 1][0] < end <= bounds[i + 1][0] + 1:
                end = bounds[i + 1][0]
            out.append(_slice(pid, self.lane, name, start, round(end - start, 1), args))
        return out


def _slice(pid: int, tid: int, name: str, ts: float, dur: float, args: dict) -> dict:
    return {"name": name, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def _step_number(name: str) -> int:
    found = re.search(r"(\d+)$", name)
    return int(found.group(1)) if found else 0


class Points:
    """A process's instants or counter samples: every second one goes past `MAX_POINTS`
    (and then only every second one is kept, and so on)."""

    def __init__(self) -> None:
        self.kept: list[dict] = []
        self.every, self._seen = 1, 0

    def add(self, event: dict) -> None:
        self._seen += 1
        if self._seen % self.every:
            return
        self.kept.append(event)
        if len(self.kept) > MAX_POINTS:
            self.kept = self.kept[::2]
            self.every *= 2


class Track:
    """What the trace holds of one process (a rank's, or the driver's)."""

    def __init__(self, pid: int, label: str, lanes: dict[int, str]):
        self.pid, self.label, self.lane_names = pid, label, lanes
        self.lanes = {lane: Lane(lane) for lane in lanes}
        self.instants, self.counters = Points(), Points()
        self.open: dict[int, tuple[float, str, dict]] = {}
        """Slices begun and not yet ended, by lane (a rank's launch phase, an attempt)."""

    def begin(self, lane: int, name: str, ts: float, args: dict | None = None) -> None:
        """End the lane's open slice at `ts` and begin `name` there."""
        self.end(lane, ts)
        self.open[lane] = (ts, name, args or {})

    def end(self, lane: int, ts: float, args: dict | None = None) -> None:
        if lane in self.open:
            begun, name, begun_args = self.open.pop(lane)
            self.lanes[lane].add(begun, max(0.0, ts - begun), name, {**begun_args, **(args or {})})

    def instant(self, name: str, ts: float, args: dict | None, lane: int = EVENTS) -> None:
        event = {
            "name": name,
            "ph": "i",
            "s": "t",
            "ts": round(ts, 1),
            "pid": self.pid,
            "tid": lane,
        }
        self.instants.add({**event, "args": args or {}})

    def counter(self, name: str, ts: float, args: dict) -> None:
        self.counters.add(
            {"name": name, "ph": "C", "ts": round(ts, 1), "pid": self.pid, "args": args}
        )

    def events(self, now: float) -> list[dict]:
        """Its metadata, slices (the open ones as if they ended `now`: the job may go on,
        a warm world's), instants and counters."""
        out = [_meta(self.pid, 0, "process_name", self.label)]
        out.append(_meta(self.pid, 0, "process_sort_index", self.pid, key="sort_index"))
        out += [_meta(self.pid, tid, "thread_name", name) for tid, name in self.lane_names.items()]
        for lane in self.lanes.values():
            out += lane.events(self.pid)
        for lane, (begun, name, args) in self.open.items():
            start, dur = round(begun, 1), round(max(0.0, now - begun), 1)
            out.append(_slice(self.pid, lane, name, start, dur, {**args, "unfinished": True}))
        out += self.instants.kept
        out += [{**c, "tid": 0} for c in self.counters.kept]
        return out

    def halve(self) -> None:
        for lane in self.lanes.values():
            lane.halve()


def _meta(pid: int, tid: int, name: str, value: Any, key: str = "name") -> dict:
    return {"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": {key: value}}


class JobTrace:
    """A job's trace as it happens: the driver's track and one per rank; thread-safe."""

    def __init__(self, job_id: str = "", name: str = "job", enabled: bool = True):
        self.job_id, self.name, self.enabled = job_id, name, enabled
        self.start_unix_s = time.time()
        self._start = time.monotonic()
        self._lock = threading.Lock()
        self.driver = Track(DRIVER, "driver", DRIVER_LANES)
        self.ranks: dict[int, Track] = {}
        self._per_task = 1
        self.np = 0
        self._submitted: float | None = None
        self._last_loss: float | None = None
        """When a rank was last lost: a task that starts later was scheduled again then."""
        self._tasks: dict[int, float] = {}
        self.outcome = "running"

    def now_us(self) -> float:
        """The trace's clock: µs since the job started, on the driver."""
        return self.at_us(time.monotonic())

    def at_us(self, monotonic_s: float) -> float:
        """The trace's clock at `monotonic_s` (this process's `time.monotonic()`): one
        mapping for every call, where reading both clocks apart drifts by a thread switch."""
        return (monotonic_s - self._start) * 1e6

    def clock_for_rank(self) -> float:
        """What a rank's `Welcome` says of the clock: now, or -1 when nothing is traced."""
        return self.now_us() if self.enabled else -1.0

    def _rank(self, rank: int) -> Track:
        track = self.ranks.get(rank)
        if track is None:
            track = self.ranks[rank] = Track(rank_pid(rank), f"rank {rank}", RANK_LANES)
        return track

    # --- the driver's events -----------------------------------------------------------

    def attempt_started(self, number: int, why: str, per_task: int, np: int = 0) -> None:
        with self._lock:
            now = self.now_us()
            name = f"attempt {number + 1}"
            self.driver.begin(JOB, name, now, {"why": why} if number else None)
            self._per_task, self._submitted, self._tasks = max(per_task, 1), None, {}
            self._last_loss, self.np = None, np or self.np

    def attempt_ended(self, outcome: str) -> None:
        with self._lock:
            now = self.now_us()
            self.outcome = outcome
            self.driver.end(JOB, now, {"outcome": outcome})
            for track in self.ranks.values():
                for lane in list(track.open):
                    track.end(lane, now)

    def stage_submitted(self) -> None:
        with self._lock:
            self._submitted = now = self.now_us()
            self.driver.instant("stage submitted", now, None)

    def task_started(self, index: int) -> None:
        with self._lock:
            self._tasks[index] = now = self.now_us()
            self.driver.instant("task started", now, {"task": index})

    def rank_connected(self, rank: int, host: str) -> float:
        """Rank `rank` said hello from `host`: its launch phases so far; returns the
        clock for its `Welcome` (`clock_for_rank`)."""
        with self._lock:
            now = self.now_us()
            track = self._rank(rank)
            track.label = f"rank {rank} ({host})"
            task_start = self._tasks.get(rank // self._per_task)
            if self._submitted is not None and task_start is not None:
                again = self._last_loss is not None and self._last_loss <= task_start
                track.begin(LAUNCH, "scheduled", self._last_loss if again else self._submitted)
                track.begin(LAUNCH, "starting", task_start)
            track.begin(LAUNCH, "loading", now)
            track.instant("rank started", now, {"host": host})
        return self.clock_for_rank()

    def rank_events(self, rank: int, events: Iterable[tuple]) -> None:
        """Events a rank sent with a sign of life (`rank_trace`); malformed ones dropped."""
        with self._lock:
            track = self._rank(rank)
            for event in events:
                _add_rank_event(track, event)

    def rank_ended(self, rank: int, how: str, reason: str = "") -> None:
        """Rank `rank` returned ("returned"), exited ("exited"), was stopped with the job
        ("stopped") or failed ("failed": an instant with why); only its first end counts
        (an error, then its exit)."""
        with self._lock:
            now = self.now_us()
            track = self._rank(rank)
            if LAUNCH not in track.open:
                return
            track.end(LAUNCH, now, {"ended": how})
            if how == "failed":
                track.instant("failure", now, {"reason": reason[:500]})
                self._last_loss = now

    def world(self, size: int, generation: int | None, why: str) -> None:
        """The world has `size` ranks now (an in-process world's `generation`)."""
        with self._lock:
            now = self.now_us()
            self.driver.counter("world size", now, {"ranks": size})
            if generation is not None:
                self.driver.begin(GENERATIONS, f"generation {generation}", now, {"ranks": size})
            if generation:  # a change, not the first world
                self.driver.instant("world change", now, {"ranks": size, "why": why[:500]})

    def world_waits(self, size: int, why: str) -> None:
        """An in-process world left below min_np: its `size` survivors wait for slots, in
        no generation until enough came back (a world change with no generation)."""
        with self._lock:
            now = self.now_us()
            self.driver.counter("world size", now, {"ranks": size})
            self.driver.instant("world change", now, {"ranks": size, "why": why[:500]})

    def stall(
        self, since_us: float, until_us: float, why: str, silent: dict[int, tuple[float, float]]
    ) -> None:
        """No rank spoke from `since_us` to `until_us`; `silent`: each quiet rank's silence,
        from its last sign of life to its next (or the stall's end)."""
        with self._lock:
            self.driver.lanes[STALLS].add(since_us, until_us - since_us, "stall", {"why": why})
            for rank, (last, spoke) in silent.items():
                lane = self._rank(rank).lanes[STALLS]
                lane.add(last, max(0.0, spoke - last), "silent", None)

    def run(self, name: str, since_us: float, args: dict | None = None) -> None:
        """A warm world's run, from `since_us` to now, on the driver's job lane (inside
        the world's attempt)."""
        with self._lock:
            now = self.now_us()
            attempt = self.driver.open.get(JOB)
            since_us = max(since_us, attempt[0]) if attempt else since_us  # inside it
            self.driver.lanes[JOB].add(since_us, now - since_us, name, args)

    def instant(self, name: str, args: dict | None = None, ranks: Iterable[int] = ()) -> None:
        """An instant on the driver ("stacks", "notice"), and on each of `ranks`."""
        with self._lock:
            now = self.now_us()
            self.driver.instant(name, now, args)
            for rank in ranks:
                self._rank(rank).instant(name, now, args)

    def merge(self, other: dict) -> None:
        """Take in the trace another process recorded of this job (a relayed job's task
        0, which serves the ranks in the client's place): its ranks' tracks whole, and
        the stalls, instants, world sizes and generations of its driver track. Its clock
        is mapped to this one by the two processes' wall clocks at their start."""
        meta = other.get("otherData", {}).get("sparkdist", {})
        shift = (meta.get("start_unix_s", self.start_unix_s) - self.start_unix_s) * 1e6
        events = [e for e in other.get("traceEvents", []) if isinstance(e, dict)]
        with self._lock:
            first_generation = min(
                (e["ts"] for e in events if e.get("pid") == DRIVER and e.get("tid") == GENERATIONS),
                default=None,
            )
            if first_generation is not None:
                self.driver.end(GENERATIONS, first_generation + shift)
            for event in events:
                self._merge_event(event, shift)

    def _merge_event(self, event: dict, shift: float) -> None:
        pid, ph, ts = event.get("pid"), event.get("ph"), event.get("ts", 0) + shift
        if pid == DRIVER:
            track = self.driver
            if ph == "X" and event.get("tid") not in (STALLS, GENERATIONS):
                return  # the client's own attempts
        else:
            track = self._rank(pid - 1)
        args = event.get("args") or {}
        if ph == "M" and event.get("name") == "process_name" and pid != DRIVER:
            track.label = args.get("name", track.label)
        elif ph == "X" and event.get("tid") in track.lanes:
            track.lanes[event["tid"]].add(ts, event.get("dur", 0.0), event["name"], args)
        elif ph == "i":
            track.instant(event["name"], ts, args, event.get("tid", EVENTS))
        elif ph == "C":
            track.counter(event["name"], ts, args)

    # --- the file ----------------------------------------------------------------------

    def to_dict(self, extra: dict | None = None) -> dict:
        """The trace, merged until it fits `SIZE_CAP_BYTES`."""
        with self._lock:
            while True:
                trace = self._dict(extra or {})
                if len(json.dumps(trace)) <= SIZE_CAP_BYTES:
                    return trace
                for track in [self.driver, *self.ranks.values()]:
                    track.halve()

    def to_json(self, extra: dict | None = None) -> bytes:
        """The trace as the file holds it (compact JSON), merged until the file fits
        `SIZE_CAP_BYTES`: encoded once a try, the bytes measured are the bytes written."""
        with self._lock:
            while True:
                data = json.dumps(self._dict(extra or {}), separators=(",", ":")).encode()
                if len(data) <= SIZE_CAP_BYTES:
                    return data
                for track in [self.driver, *self.ranks.values()]:
                    track.halve()

    def _dict(self, extra: dict) -> dict:
        now = self.now_us()
        events = self.driver.events(now)
        for rank in sorted(self.ranks):
            events += self.ranks[rank].events(now)
        meta = {
            "version": VERSION,
            "job_id": self.job_id,
            "name": self.name,
            "np": self.np or len(self.ranks),
            "ranks": len(self.ranks),
            "outcome": self.outcome,
            "start_unix_s": self.start_unix_s,
            "merged": {
                str(rank): track.lanes[STEPS].per_slice
                for rank, track in self.ranks.items()
                if track.lanes[STEPS].per_slice > 1
            },
            **extra,
        }
        return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"sparkdist": meta}}

    def write(self, directory: str | os.PathLike, extra: dict | None = None) -> str:
        """Write `trace.json` into `directory` (atomically); returns its path."""
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, FILE_NAME)
        partial = f"{path}.partial"
        with open(partial, "wb") as f:
            f.write(self.to_json(extra))
        os.replace(partial, path)
        return path


def _add_rank_event(track: Track, event: Any) -> None:
    try:
        ph, lane, name, ts, dur, args = event
        ts, dur = float(ts), float(dur)
        if not isinstance(name, str) or not (args is None or isinstance(args, dict)):
            return
    except (TypeError, ValueError):
        return
    if ph == "main":
        track.begin(LAUNCH, "main", ts)
    elif ph == "X" and lane in track.lanes and lane != LAUNCH:
        track.lanes[lane].add(ts, dur, name, args)
    elif ph == "i":
        track.instant(name, ts, args, lane if lane in track.lanes else EVENTS)
    elif ph == "C" and args:
        track.counter(name, ts, args)
