"""Recovery from a lost host: how long from a worker's loss to the next training step.

On the namespaced standalone cluster of the multi-host tests (tests/cluster: three
hosts, a Spark worker each, built with network namespaces; needs root), one driver
application with one executor per host runs a 3-rank DDP regression that takes a step
every STEP_S seconds. Once it has taken a few steps, the benchmark SIGKILLs the Spark
worker of a host that does not run rank 0 (and everything under it, as when a host is
lost), and measures the time to the next step the job records, with:

* sparkdist elastic (min_np=2, max_np=3, max_failures=1): relaunches at once with the
  two hosts left, from its last checkpoint;
* sparkdist fixed-size (np=3, max_failures=1): relaunches from its checkpoint once
  three slots are there again; a replacement worker arrives REPLACEMENT_S after the loss;
* pyspark's TorchDistributor (np=3): the barrier stage fails; the time is to the error.

After each case the worker is started again, so the next case finds three hosts.

    sudo .venv/bin/python benchmarks/elastic_recovery.py [--replacement-s 30]

Prints one table. Takes a few minutes; not part of `make test`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "cluster"))

from netns_cluster import HOST_RESOURCE_CONF, NetnsCluster, can_build  # noqa: E402
from remote_driver import RemoteDriver  # noqa: E402

PREFIX = "sdb"
SUBNET = "10.213.27"
STEP_S = 0.4
KILL_AFTER_STEP = 5
RUNNER = {"start_timeout": 180, "timeout": 600}


def read_steps(progress: Path) -> list[dict]:
    path = progress / "steps.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for(condition, job, what: str, timeout_s: float = 300):
    """Poll `condition()` until it returns something true; fail if the job ended first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        if job is not None and job.done():
            raise RuntimeError(f"the job ended before {what}: {job.result()}")
        time.sleep(0.02)
    raise TimeoutError(f"no {what} within {timeout_s}s")


def host_of_pid(cluster: NetnsCluster, pid: int) -> int:
    """Which host's worker the process `pid` runs under."""
    import psutil

    parents = {p.pid for p in psutil.Process(pid).parents()}
    for i in range(cluster.state.hosts):
        if cluster.state.pids[f"worker-{i}"] in parents:
            return i
    raise RuntimeError(f"process {pid} runs under no worker")


def victim(cluster: NetnsCluster, progress: Path) -> int:
    """A host that runs a rank but not rank 0 (its saves are the record)."""
    ranks = {}
    for path in progress.glob("rank-*.json"):
        where = json.loads(path.read_text())
        ranks[where["rank"]] = where["pid"]
    return host_of_pid(cluster, ranks[max(ranks)])


def wait_executors(remote: RemoteDriver, count: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while len(remote.call("executor_hosts")) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{remote.name} did not get {count} executors back")
        time.sleep(0.5)


def run_case(cluster, remote, name: str, submit, replacement_s: float | None) -> dict:
    """Start a job with `submit(progress, stop_file)`, kill a host after a few steps,
    bring the worker back (after `replacement_s`, or once the job stepped again), and
    measure loss -> next step."""
    progress = Path(tempfile.mkdtemp(prefix=f"elastic-bench-{name}-"))
    stop_file = progress / "stop"
    job = submit(progress, stop_file)
    wait_for(lambda: len(read_steps(progress)) >= KILL_AFTER_STEP, job, "the first steps")
    lost = victim(cluster, progress)
    killed_at = time.time()  # stop_worker SIGKILLs first, then waits for the master
    cluster.stop_worker(lost)
    print(f"  {name}: killed host {lost}'s worker after step {len(read_steps(progress))}")
    returned = threading.Event()

    def bring_back() -> None:
        cluster.start_worker(lost)
        returned.set()

    timer = None
    if replacement_s is not None:
        timer = threading.Timer(replacement_s, bring_back)
        timer.start()

    def next_step():
        return next((r for r in read_steps(progress) if r["at"] > killed_at), None)

    row = {"case": name, "next_step_s": None, "world_after": None, "outcome": ""}
    try:
        step = wait_for(next_step, job, "a step after the loss", timeout_s=400)
        row["next_step_s"] = step["at"] - killed_at
        row["world_after"] = step["world_size"]
    except RuntimeError:
        pass  # the job ended (failed) without another step
    stop_file.touch()
    result = job.result(timeout=600)
    if timer is None:
        bring_back()
    else:
        timer.join()
        returned.wait(180)
    wait_executors(remote, cluster.state.hosts)
    if result["ok"]:
        row["outcome"] = f"succeeded, {result.get('attempts', 1)} attempts"
    else:
        row["outcome"] = f"failed: {result.get('error_type')}"
        if row["next_step_s"] is None and result.get("failed_at"):
            row["error_s"] = result["failed_at"] - killed_at
        lines = (result.get("error") or "").strip().splitlines() or [""]
        row["error"] = next((x for x in lines if "Exception:" in x), lines[0]).strip()[:200]
    print(f"  {name}: {row}", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replacement-s", type=float, default=30.0)
    args = parser.parse_args()
    reason = can_build()
    if reason:
        raise SystemExit(f"cannot build the namespaced cluster: {reason}")
    cluster = NetnsCluster(hosts=3, prefix=PREFIX, subnet=SUBNET, worker_cores=3).up()
    # One executor per host (a host's loss takes its slot away until a worker returns);
    # Gloo on the hosts' network interface for TorchDistributor's processes (their host
    # names resolve to loopback here; sparkdist's ranks pick the interface themselves).
    conf = {**HOST_RESOURCE_CONF, "spark.executorEnv.GLOO_SOCKET_IFNAME": "tn0"}
    os.environ["PYSPARK_SUBMIT_ARGS"] = (
        " ".join(f"--conf {k}={v}" for k, v in conf.items()) + " pyspark-shell"
    )
    rows = []
    try:
        remote = RemoteDriver(cluster, "bench", cores=3)
        try:
            wait_executors(remote, 3)

            def sparkdist_job(runner):
                def submit(progress, stop_file):
                    kwargs = {
                        "progress_dir": str(progress),
                        "min_steps": KILL_AFTER_STEP + 5,
                        "stop_file": str(stop_file),
                        "step_s": STEP_S,
                    }
                    return remote.submit(
                        "run_job", main="elastic_main", np=3, runner=runner, kwargs=kwargs
                    )

                return submit

            def distributor(progress, stop_file):
                return remote.submit(
                    "run_torch_distributor", progress_dir=str(progress), steps=150, step_s=STEP_S
                )

            elastic = {**RUNNER, "min_np": 2, "max_np": 3, "max_failures": 1}
            fixed = {**RUNNER, "max_failures": 1}
            cases = [
                ("sparkdist elastic (min_np=2, max_np=3)", sparkdist_job(elastic), None),
                (
                    f"sparkdist fixed np=3, max_failures=1, replacement after "
                    f"{args.replacement_s:.0f}s",
                    sparkdist_job(fixed),
                    args.replacement_s,
                ),
                ("pyspark TorchDistributor np=3", distributor, None),
            ]
            for name, submit, replacement_s in cases:
                rows.append(run_case(cluster, remote, name, submit, replacement_s))
        finally:
            remote.close()
    finally:
        cluster.down()

    print()
    print(
        f"Loss of one of 3 hosts (Spark worker and its executors SIGKILLed) during a 3-rank "
        f"DDP job, a step every {STEP_S}s; standalone cluster in network namespaces"
    )
    print(f"{'job':<58} {'loss -> next step':>18} {'ranks after':>12}  outcome")
    for row in rows:
        if row["next_step_s"] is not None:
            took = f"{row['next_step_s']:.1f}s"
        elif "error_s" in row:
            took = f"none (error {row['error_s']:.1f}s)"
        else:
            took = "none"
        ranks = "-" if row["world_after"] is None else str(row["world_after"])
        print(f"{row['case']:<58} {took:>18} {ranks:>12}  {row['outcome']}")
    for row in rows:
        if row.get("error"):
            print(f"  {row['case']}: {row['error']}")


if __name__ == "__main__":
    main()
