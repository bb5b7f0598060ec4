"""Traces made by hand, as format.py describes them, for the validator's and the picture's
tests: ranks with a given step time, data waits of a given share of each step, checkpoint
saves, failures, GPU memory, and an elastic world's changes on the driver."""

from __future__ import annotations

from sparkdist.trace import format

MS = 1000  # microseconds


def meta(pid: int, tid: int, name: str, value) -> dict:
    key = "sort_index" if name.endswith("sort_index") else "name"
    return {"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": {key: value}}


def process(pid: int, label: str, lanes: dict[int, str]) -> list[dict]:
    """A process's metadata: its name, its place and its lanes' names."""
    events = [meta(pid, 0, "process_name", label), meta(pid, 0, "process_sort_index", pid)]
    return events + [meta(pid, tid, "thread_name", name) for tid, name in lanes.items()]


def slice_(pid: int, tid: int, name: str, ts: int, dur: int, **args) -> dict:
    return {"name": name, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def instant(pid: int, name: str, ts: int, scope: str = "t", **args) -> dict:
    event = {"name": name, "ph": "i", "s": scope, "ts": ts, "pid": pid, "tid": format.EVENTS}
    return {**event, "args": args}


def counter(pid: int, name: str, ts: int, **args) -> dict:
    return {"name": name, "ph": "C", "ts": ts, "pid": pid, "tid": 0, "args": args}


def rank_events(
    rank: int,
    step_ms: int,
    steps: int = 10,
    wait_share: float = 0.25,
    failure: str | None = None,
    gpu_mib: list[float] | None = None,
) -> list[dict]:
    """One rank: launched in three phases, then `steps` steps of `step_ms` each, each
    starting with a data wait of `wait_share` of it; a save every 5 steps; `failure`:
    the reason of a failure instant at the end of `main`."""
    pid = format.rank_pid(rank)
    events = process(pid, f"rank {rank} (host-{rank})", format.RANK_LANES)
    start = 5 * MS * (rank + 1)
    for name, length in (("scheduled", 20 * MS), ("starting", 30 * MS), ("loading", 10 * MS)):
        events.append(slice_(pid, format.LAUNCH, name, start, length))
        start += length
    main_ms = steps * step_ms
    events.append(slice_(pid, format.LAUNCH, "main", start, main_ms * MS))
    for step in range(steps):
        ts = start + step * step_ms * MS
        events.append(slice_(pid, format.STEPS, f"step {step}", ts, step_ms * MS, steps=1))
        wait = round(step_ms * MS * wait_share)
        events.append(slice_(pid, format.DATA_WAIT, "data wait", ts, wait, waits=1))
        if step % 5 == 4:
            events.append(slice_(pid, format.CHECKPOINT, "save", ts + step_ms * MS - MS, MS))
    for index, mib in enumerate(gpu_mib or []):
        events.append(counter(pid, "gpu memory", start + index * MS, allocated_mib=mib))
    if failure is not None:
        events.append(instant(pid, "failure", start + main_ms * MS, reason=failure))
    return events


def driver_events(end_us: int, world: list[tuple[int, int]] = ()) -> list[dict]:
    """The driver: one attempt over the job; `world`: (µs, size) world changes, each with
    its counter sample and a generation from there on."""
    pid = format.DRIVER
    events = process(pid, "driver", format.DRIVER_LANES)
    events.append(slice_(pid, format.JOB, "attempt 1", 0, end_us))
    events.append(instant(pid, "stage submitted", MS))
    events.append(counter(pid, "world size", 0, ranks=world[0][1] if world else 1))
    for index, (ts, size) in enumerate(world):
        end = world[index + 1][0] if index + 1 < len(world) else end_us
        events.append(counter(pid, "world size", ts, ranks=size))
        events.append(instant(pid, "world change", ts, ranks=size, why=f"generation {index}"))
        events.append(slice_(pid, format.GENERATIONS, f"generation {index}", ts, end - ts))
    return events


def job_trace(
    step_ms: list[int],
    steps: int = 10,
    wait_share: float | list[float] = 0.25,
    failures: dict[int, str] | None = None,
    gpu_mib: dict[int, list[float]] | None = None,
    world: list[tuple[int, int]] = (),
) -> dict:
    """A whole job's trace: rank r steps every `step_ms[r]` ms."""
    shares = wait_share if isinstance(wait_share, list) else [wait_share] * len(step_ms)
    events = []
    for rank, ms in enumerate(step_ms):
        failure = (failures or {}).get(rank)
        mib = (gpu_mib or {}).get(rank)
        events += rank_events(rank, ms, steps, shares[rank], failure, mib)
    end_us = max(e["ts"] + e.get("dur", 0) for e in events) + MS
    events = driver_events(end_us, list(world)) + events
    other = {"version": format.VERSION, "job_id": "job-1", "name": "synthetic", "np": 3}
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"sparkdist": {**other, "outcome": "failed" if failures else "succeeded"}},
    }
