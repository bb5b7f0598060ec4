"""The cluster's stall scenarios, run by tests/runner/test_stalls_cluster.py in a process of
their own: np=3 jobs, several at once (`local-cluster[3,3,1024]`: nine slots), which the test
session's shared two-executor Spark cannot give. Prints one `RESULT {json}` line.

Most scenarios wait on a time limit or a stall, so they run at once, each job from a thread
of its own (as tune's concurrent trials do), each with its own lock file, in lanes: the two
mpirun jobs one after the other (concurrent mpirun jobs on one host can collide); the short
stall timeout after the elastic job (its ranks also beat while torch imports); the
straggler cases, which measure step rates, only after the others, beside each other (no
torch, no collectives: cheap ranks). A job starts only once the others' ranks are stuck
(`Settled`): one job's ranks import torch at a time, as when they ran one by one. Each
`Warnings` handler keeps only its own job's messages."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import stall_jobs  # noqa: E402

from sparkdist import HorovodRunner  # noqa: E402
from sparkdist.errors import JobTimeoutError  # noqa: E402

ELASTIC = {
    "stall_timeout": 6,
    "stall_warning": None,
    "env": {"SPARKDIST_ELASTIC_TIMEOUT_S": "300"},
}
"""An in-process elastic job (`sparkdist.elastic.run`, `min_np`/`max_np`): a short stall
timeout (its commits are signs of life up to the stall; gloo's own timeout, longer than the
test, must not end the stalled collective first)."""


def left(runner) -> list[int]:
    deadline = time.monotonic() + 15
    while any(p.alive() for p in runner.last_job.processes) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p.pid for p in runner.last_job.processes if p.alive()]


def lock_timeout(
    launcher: str, lock: str, job=stall_jobs.lock_job, job_kwargs: dict | None = None, **options
) -> dict:
    open(lock, "w").close()
    runner = HorovodRunner(np=3, launcher=launcher, **options)
    started = time.monotonic()
    try:
        runner.run(job, lock_file=lock, **(job_kwargs or {}))
        return {"error": None}
    except JobTimeoutError as exc:
        ended = time.time()
        stuck_file = lock + ".stuck"  # written by the stuck rank (stall_jobs.stuck)
        return {
            "error": type(exc).__name__,
            "stacks": exc.stacks,
            "message": str(exc),
            "seconds": time.monotonic() - started,
            # From rank 1 stopping at its lock (the last steps' lines came just before) to
            # the job's error; None if it never got there.
            "after_stuck": (
                ended - os.path.getmtime(stuck_file) if os.path.exists(stuck_file) else None
            ),
            "left": left(runner),
        }


class Warnings(logging.Handler):
    """Releases the lock at the first stall warning; keeps what was said, and when: only
    what `runner`'s job said of all the jobs running at once. `named`: only messages that
    name a job (a stall warning does): the stacks another job's watch shows on their own
    when it drops a rank name no job, and must not release this job's lock."""

    def __init__(self, lock: str, runner: HorovodRunner, named: bool = False):
        super().__init__()
        self.lock_file, self.runner, self.named, self.said = lock, runner, named, []

    def mine(self, text: str) -> bool:
        """Not a message that names another job ("sparkdist job <id>: ...")."""
        job = self.runner.last_job
        if not text.startswith("sparkdist job "):
            return not self.named
        return job is None or text.startswith(f"sparkdist job {job.job_id}:")

    def emit(self, record):
        text = record.getMessage()
        if not self.mine(text):
            return
        self.said.append((time.time(), text))
        # A warning may come while the ranks import torch; the lock goes once rank 1 is stuck.
        if "stuck (stall_jobs.py" in text and os.path.exists(self.lock_file):
            os.unlink(self.lock_file)


def stall_warning(lock: str) -> dict:
    open(lock, "w").close()
    runner = HorovodRunner(np=3, launcher="mpi", stall_warning=10)
    handler = Warnings(lock, runner, named=True)
    logging.getLogger("sparkdist").addHandler(handler)
    try:
        result = runner.run_all(stall_jobs.lock_job, lock_file=lock, steps=12)
    finally:
        logging.getLogger("sparkdist").removeHandler(handler)
    return {"result": result, "said": [text for _, text in handler.said]}


def stragglers(slow_rank: int) -> dict:
    runner = HorovodRunner(np=3, launcher="direct")
    handler = Warnings("", runner)
    logging.getLogger("sparkdist").addHandler(handler)
    try:
        steps = runner.run_all(stall_jobs.crawl, seconds=14, slow_rank=slow_rank, extra_s=0.3)
    finally:
        logging.getLogger("sparkdist").removeHandler(handler)
    named = [(t, text) for t, text in handler.said if "is a straggler" in text]
    slow_steps = None
    if named:  # the slow rank's reports that reached the driver before it was named
        slow_steps = sum(
            1 for r in runner.last_job.reported if r.rank == slow_rank and r.time <= named[0][0]
        )
    return {
        "steps": steps,
        "stragglers": runner.last_job.stragglers,
        "slow_steps_when_named": slow_steps,
    }


def elastic_drop(lock: str) -> dict:
    """An in-process elastic world of 3 (min_np=2) whose launch rank 1 blocks in the
    user's code: what the driver said of the job, its world changes and the ranks' values."""
    open(lock, "w").close()
    runner = HorovodRunner(np=3, launcher="direct", min_np=2, max_np=3, **ELASTIC)
    handler = Warnings("", runner)
    logging.getLogger("sparkdist").addHandler(handler)
    try:
        result = runner.run_all(stall_jobs.elastic_lock_job, lock_file=lock, by_launch_rank=True)
    finally:
        logging.getLogger("sparkdist").removeHandler(handler)
    return {
        "result": result,
        "said": [text for _, text in handler.said],
        "failures": [str(failure) for failure in runner.last_job.failures],
        "left": left(runner),
    }


class Settled:
    """Starts one job at a time: a scenario begins once every running one is settled, its
    rank stuck (`<lock>.stuck`, tests/stall_jobs.py) or its job ended (a scenario without
    such a file, "", never holds the next back). The time limits then count while only the
    new job's ranks import torch, as when they ran one by one."""

    def __init__(self):
        self.cond = threading.Condition()
        self.running: dict[str, str] = {}  # scenario -> the file its stuck rank writes

    def begin(self, name: str, marker: str) -> None:
        with self.cond:
            while not all(not m or os.path.exists(m) for m in self.running.values()):
                self.cond.wait(0.2)  # the marker is a file: looked at again and again
            self.running[name] = marker

    def end(self, name: str) -> None:
        with self.cond:
            self.running.pop(name, None)
            self.cond.notify_all()


def run_lane(scenarios: dict, names: list[str], settled: Settled) -> dict:
    """Run the named scenarios one after the other; print each outcome as it comes."""
    out = {}
    for name in names:
        run, marker = scenarios[name]
        settled.begin(name, marker)
        started = time.monotonic()
        try:
            out[name] = run()
        finally:
            settled.end(name)
        took = time.monotonic() - started
        print(f"SCENARIO {name} ({took:.0f}s) " + json.dumps(out[name]), flush=True)
    return out


def run_lanes(scenarios: dict, lanes: list[list[str]]) -> dict:
    """Run the lanes at once, a thread each."""
    out, settled = {}, Settled()
    with ThreadPoolExecutor(len(lanes)) as pool:
        futures = [pool.submit(run_lane, scenarios, names, settled) for names in lanes]
        for lane in futures:
            out.update(lane.result())
    return out


def main() -> None:
    from sparkdist.spark.session import embedded_spark

    spark = embedded_spark(
        app_name="sparkdist-stalls",
        master="local-cluster[3,3,1024]",
        conf={"spark.ui.enabled": "false"},
    )
    lock = os.path.join(sys.argv[1], "lock-")
    scenarios = {  # name: (the scenario, the file that says its job is settled)
        "direct": (lambda: lock_timeout("direct", lock + "direct", timeout=45), lock + "direct"),
        # mpirun's ranks start behind its daemons: at a load average of 8-14 on 2 cores
        # all three were still importing torch when a 45 s limit ran out (2 runs in 4).
        "mpi": (lambda: lock_timeout("mpi", lock + "mpi", timeout=75), lock + "mpi"),
        "stall_timeout": (
            lambda: lock_timeout(
                "direct", lock + "stall", stall_timeout=20, job_kwargs={"beat": True}
            ),
            lock + "stall",
        ),
        "stall_warning": (lambda: stall_warning(lock + "warning"), lock + "warning"),
        "elastic": (lambda: elastic_drop(lock + "elastic"), lock + "elastic"),
        "straggler": (lambda: stragglers(1), ""),
        "even": (lambda: stragglers(-1), ""),
    }
    scenarios = {
        name: (run, marker and marker + ".stuck") for name, (run, marker) in scenarios.items()
    }
    phases = [  # lanes at once, phase after phase
        [["mpi", "stall_warning"], ["direct"], ["elastic", "stall_timeout"]],
        [["straggler"], ["even"]],
    ]
    if sys.argv[2:]:  # by hand: some of them only, one after the other
        phases = [[sys.argv[2:]]]
    out = {}
    for lanes in phases:
        out.update(run_lanes(scenarios, lanes))
    spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
