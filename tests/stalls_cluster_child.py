"""The cluster's stall scenarios, run by tests/runner/test_stalls_cluster.py in a process of
their own: three executors (`local-cluster[3,1,1024]`), which the test session's shared
two-executor Spark cannot give. Prints one `RESULT {json}` line."""

from __future__ import annotations

import json
import logging
import os
import sys
import time

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


def lock_timeout(launcher: str, lock: str, job=stall_jobs.lock_job, **options) -> dict:
    open(lock, "w").close()
    runner = HorovodRunner(np=3, launcher=launcher, **options)
    started = time.monotonic()
    try:
        runner.run(job, lock_file=lock)
        return {"error": None}
    except JobTimeoutError as exc:
        return {
            "error": type(exc).__name__,
            "stacks": exc.stacks,
            "message": str(exc),
            "seconds": time.monotonic() - started,
            "left": left(runner),
        }


class Warnings(logging.Handler):
    """Releases the lock at the first stall warning; keeps what was said, and when."""

    def __init__(self, lock: str):
        super().__init__()
        self.lock_file, self.said = lock, []

    def emit(self, record):
        text = record.getMessage()
        self.said.append((time.time(), text))
        # A warning may come while the ranks import torch; the lock goes once rank 1 is stuck.
        if "stuck (stall_jobs.py" in text and os.path.exists(self.lock_file):
            os.unlink(self.lock_file)


def stall_warning(lock: str) -> dict:
    open(lock, "w").close()
    handler = Warnings(lock)
    logging.getLogger("sparkdist").addHandler(handler)
    try:
        runner = HorovodRunner(np=3, launcher="mpi", stall_warning=10)
        result = runner.run_all(stall_jobs.lock_job, lock_file=lock, steps=12)
    finally:
        logging.getLogger("sparkdist").removeHandler(handler)
    return {"result": result, "said": [text for _, text in handler.said]}


def stragglers(slow_rank: int) -> dict:
    handler = Warnings("")
    logging.getLogger("sparkdist").addHandler(handler)
    try:
        runner = HorovodRunner(np=3, launcher="direct")
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


def main() -> None:
    from sparkdist.spark.session import embedded_spark

    spark = embedded_spark(
        app_name="sparkdist-stalls",
        master="local-cluster[3,1,1024]",
        conf={"spark.ui.enabled": "false"},
    )
    lock = os.path.join(sys.argv[1], "lock")
    scenarios = {
        "direct": lambda: lock_timeout("direct", lock, timeout=45),
        "mpi": lambda: lock_timeout("mpi", lock, timeout=45),
        "stall_timeout": lambda: lock_timeout("direct", lock, stall_timeout=20),
        "stall_warning": lambda: stall_warning(lock),
        "elastic": lambda: lock_timeout(
            "direct", lock, stall_jobs.elastic_lock_job, min_np=2, max_np=3, **ELASTIC
        ),
        "straggler": lambda: stragglers(1),
        "even": lambda: stragglers(-1),
    }
    chosen = sys.argv[2:] or list(scenarios)  # by hand: some of them only
    out = {}
    for name in chosen:
        scenario = scenarios[name]
        out[name] = scenario()
        print(f"SCENARIO {name} " + json.dumps(out[name]), flush=True)
    spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
