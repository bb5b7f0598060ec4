"""What a job's trace file holds: Chrome's Trace Event Format (JSON, object form), as
the torch profiler, Horovod, Ray, JAX and Perfetto's UI write and open it.

One file per job, `trace.json`, beside the ranks' logs (`runner.last_job.trace`):

    {"traceEvents": [...], "displayTimeUnit": "ms",
     "otherData": {"sparkdist": {"version": 1, "job_id": ..., "name": ..., "np": ...,
                                 "outcome": ..., "start_unix_s": ..., "merged": {...}}}}

* **Time**: `ts` and `dur` are microseconds since the job started on the driver's clock.
  A rank's clock is mapped to the driver's when it registers (its hello: the driver's
  time, less half the round trip).
* **Processes**: pid `DRIVER` (0) is the driver; rank r is pid `r + 1`. Each has a
  `process_name` `M` event ("driver", "rank 3 (host)") and a `process_sort_index`.
* **Lanes** (`tid`), each named by a `thread_name` `M` event. A lane's `X` slices do not
  overlap (they may nest):
  - a rank's `LAUNCH` lane: the launch phases in order, `scheduled` (stage submitted to
    its task started), `starting` (task started to the rank connected), `loading`
    (connected to `main` entered), then `main` (until it returned, raised or ended);
  - `STEPS`: one slice per step, from the end of the last to this one's `report()` or
    commit: "step N"; merged when the trace would pass its cap: "steps N-M", with
    `args["steps"]` the number merged (1 when one);
  - `DATA_WAIT`: the loader's time blocked waiting for a batch. A slice starts where a
    wait started; merged waits keep the first start and the summed time as `dur`, with
    `args["waits"]`; so a rank's data-wait time is the sum of its `dur`s, merged or not;
  - `CHECKPOINT`: "commit" (an elastic state's commit) and "save" (a checkpoint saved);
  - `STALLS`: "silent": a rank that showed no sign of life for `stall_warning` seconds,
    from its last one to when the driver noticed (or it spoke again).
* **The driver's lanes**: `JOB` (one slice per attempt: "attempt 1", "attempt 2"
  (relaunched: `args["why"]`)), `GENERATIONS` (an in-process elastic world's
  generations: "generation g", `args["ranks"]`), `STALLS` ("stall": no rank spoke).
* **Instants** (`ph` "i", `s` "t" on a lane or "p" for a whole process), named by kind
  (`INSTANTS`): "failure" on the failing rank (`args["reason"]`), "notice" (a
  decommission), "stacks" (stacks taken, `args["why"]`), "world change" (on the driver,
  `args["ranks"]`, `args["why"]`), "stage submitted", "task started", "rank started".
* **Counters** (`ph` "C"): "world size" on the driver (`args["ranks"]`); on a rank
  where CUDA is in use, "gpu memory" (`args["allocated_mib"]`, `args["reserved_mib"]`)
  and, where NVML answers, "gpu utilisation" (`args["percent"]`). On CPU there are none.
"""

from __future__ import annotations

VERSION = 1
FILE_NAME = "trace.json"
DRIVER = 0
"""The driver's pid; rank r's is `rank_pid(r)`."""

# A rank's lanes (tid) and the driver's; the numbers order them in a viewer.
LAUNCH, STEPS, DATA_WAIT, CHECKPOINT, STALLS = 1, 2, 3, 4, 5
JOB, GENERATIONS = 1, 2
EVENTS = 6
"""The lane of a process's instants that belong to no other lane."""

RANK_LANES = {
    LAUNCH: "launch",
    STEPS: "steps",
    DATA_WAIT: "data wait",
    CHECKPOINT: "checkpoint",
    STALLS: "stalls",
    EVENTS: "events",
}
DRIVER_LANES = {JOB: "job", GENERATIONS: "generations", STALLS: "stalls", EVENTS: "events"}

LAUNCH_PHASES = ("scheduled", "starting", "loading", "main")
INSTANTS = (
    "failure",
    "notice",
    "stacks",
    "world change",
    "stage submitted",
    "task started",
    "rank started",
)
COUNTERS = ("world size", "gpu memory", "gpu utilisation")

MAX_SLICES_PER_LANE = 1024
"""A lane keeps at most this many slices: past it, neighbours merge two by two (and
later slices arrive merged as many), so a job of 10,000 steps at np=64, with a data wait
and a commit every step, writes 11.9 MiB (tests/trace/test_recorder.py);
`SIZE_CAP_BYTES` is the promise."""
SIZE_CAP_BYTES = 32 * 2**20
"""No trace file is larger than this (32 MiB): the lanes merge to fit it."""


def rank_pid(rank: int) -> int:
    """The pid of rank `rank`'s process in the trace."""
    return rank + 1


def pid_rank(pid: int) -> int | None:
    """The rank of trace pid `pid`; None for the driver's."""
    return None if pid == DRIVER else pid - 1
