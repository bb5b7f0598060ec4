"""Ray on Spark, the peer of launch_overhead.py's trivial job: one Ray cluster kept on Spark
tasks, then repeated `TorchTrainer.fit` of a job that allreduces once.

Runs in .venv-ray (`make bench-ray`), not .venv: Ray is a benchmark-only peer. On a
local-cluster[2,1,1024] session like launch_overhead.py's, `setup_ray_cluster` starts a head
node on the driver (no CPUs) and one Ray worker node per executor (1 CPU each); then, per
world size, RUNS fits of a TorchTrainer whose workers do one gloo allreduce (Ray Train makes
the process group) and report the sum and every worker's pid. np=2 takes 1 CPU per worker;
np=8 takes 0.25 (8 workers on the 2 Ray CPUs).

The measuring is done by a child process of this one, which watches it: the peak resident
memory of every process of the run (sampled every half second) and which of them are still
alive after it exited. Prints one JSON line on stdout (launch_overhead.py reads it): the
setup's seconds, per world size each fit's seconds and worker pids, the memory peak, what
was alive 30 s after Ray and Spark were shut down and 120 s after the child exited (none
expected). Ray's and Spark's logs go to stderr.

    .venv-ray/bin/python benchmarks/ray_on_spark.py [--runs 5] [--np 2 8]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def train_loop() -> None:
    """One Ray Train worker: allreduce rank + 1 on the process group Ray Train made, report
    the sum and the pids of all workers. Ray Train 2 keeps only metrics reported with a
    checkpoint (`Result.metrics`), so rank 0 reports a one-file one: its way to return."""
    import ray.train
    import torch
    import torch.distributed as dist

    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    pids = [None] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid())
    metrics = {"value": value.item(), "pids": pids}
    if dist.get_rank() != 0:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "value.json"), "w") as f:
            json.dump(metrics, f)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time, state) of `pid`, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(fields[1]), int(fields[19]), fields[0]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE_SIZE
    except (FileNotFoundError, ProcessLookupError):
        return 0


def processes_of_run(marker: str) -> list[tuple[int, int]]:
    """(pid, start time) of every live process of this run: this one's descendants (Spark's
    JVMs and Python workers, Ray's nodes and workers) and any process whose command line
    names the run's folder `marker` (Ray's processes, also once re-parented)."""
    parents, starts = {}, {}
    for name in os.listdir("/proc"):
        stat = _stat(int(name)) if name.isdigit() else None
        if stat and stat[2] != "Z":
            parents[int(name)], starts[int(name)] = stat[0], stat[1]
    ours, frontier = set(), {os.getpid()}
    while frontier:
        ours |= frontier
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - ours
    ours |= {pid for pid in parents if marker in _cmdline(pid)}
    ours.discard(os.getpid())
    return [(pid, starts[pid]) for pid in ours if pid in starts]


def still_alive(
    processes: list[tuple[int, int]], timeout: float
) -> tuple[list[tuple[int, int]], float]:
    """Those of `processes` (pid, start time) still alive after up to `timeout` seconds, and
    the seconds waited (until the last was gone, or the timeout)."""
    started = time.monotonic()
    while True:
        alive = [k for k in processes if (s := _stat(k[0])) and s[1] == k[1] and s[2] != "Z"]
        if not alive or time.monotonic() - started > timeout:
            return alive, time.monotonic() - started
        time.sleep(0.5)


class MemorySampler:
    """Samples the processes of the run every `interval` seconds: every one seen (with its
    command line) and the peak of their summed resident memory."""

    def __init__(self, marker: str, interval: float = 0.5):
        self.marker = marker
        self.interval = interval
        self.seen: dict[tuple[int, int], str] = {}
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            alive = processes_of_run(self.marker)
            for key in alive:
                self.seen.setdefault(key, _cmdline(key[0])[:160])
            self.peak_rss = max(self.peak_rss, sum(_rss_bytes(pid) for pid, _ in alive))

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def start_spark():
    """A local-cluster[2,1,1024] session as launch_overhead.py's (sparkdist's
    embedded_spark), its Python workers on this interpreter (which has Ray)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = SparkSession.builder.master("local-cluster[2,1,1024]").appName("ray-on-spark")
    settings = {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.showConsoleProgress": "false",
        "spark.executor.memory": "1g",
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def stop_spark(spark) -> None:
    """Stop the session and its JVM: spark.stop() leaves the driver JVM (the Py4J gateway)
    running until this interpreter exits; it exits when its stdin closes."""
    gateway = spark.sparkContext._gateway
    spark.stop()
    gateway.shutdown()
    gateway.proc.stdin.close()
    gateway.proc.wait(timeout=60)


def setup_ray(ray_dir: str) -> float:
    """Seconds of `setup_ray_cluster`: a head node on the driver, one 1-CPU worker node per
    executor, no dashboard (its optional dependencies are not installed; without them Ray on
    Spark would wait a minute for its port)."""
    from ray.util.spark import setup_ray_cluster

    started = time.perf_counter()
    setup_ray_cluster(
        max_worker_nodes=2,
        num_cpus_worker_node=1,
        num_gpus_worker_node=0,
        memory_worker_node=2 * 1024**3,
        object_store_memory_worker_node=512 * 1024**2,
        head_node_options={"include_dashboard": False},
        ray_temp_root_dir=ray_dir,
    )
    return time.perf_counter() - started


def fit_once(np: int, storage: str, name: str) -> tuple[float, list[int]]:
    """Seconds of one `TorchTrainer.fit` at `np` workers, and the workers' pids."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    scaling = ScalingConfig(
        num_workers=np, use_gpu=False, resources_per_worker={"CPU": min(1.0, 2 / np)}
    )
    trainer = TorchTrainer(
        train_loop,
        scaling_config=scaling,
        run_config=RunConfig(storage_path=storage, name=name),
    )
    started = time.perf_counter()
    result = trainer.fit()
    elapsed = time.perf_counter() - started
    expected = np * (np + 1) / 2
    if result.metrics["value"] != expected:
        raise AssertionError(f"allreduce gave {result.metrics['value']}, expected {expected}")
    return elapsed, result.metrics["pids"]


def world_row(np: int, runs: int, storage: str) -> dict:
    """`runs` fits at `np` workers: run 1 and the median and min of the others, each fit's
    pids, and whether any worker process served two fits; an error ends the row."""
    row = {"name": f"Ray on Spark TorchTrainer.fit np={np}", "np": np, "times": [], "pids": []}
    try:
        for run in range(runs):
            elapsed, pids = fit_once(np, storage, f"np{np}-run{run + 1}")
            row["times"].append(elapsed)
            row["pids"].append(pids)
            print(f"np={np} run {run + 1}: {elapsed:.2f}s, pids {pids}", file=sys.stderr)
    except Exception as exc:  # the row reports why it stopped
        row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    times = row["times"]
    row["run1"] = times[0] if times else None
    row["rest_median"] = statistics.median(times[1:]) if len(times) > 1 else None
    row["rest_min"] = min(times[1:]) if len(times) > 1 else None
    every_pid = [pid for pids in row["pids"] for pid in pids]
    row["pids_reused"] = len(set(every_pid)) < len(every_pid)
    return row


def measure(runs: int, worlds: list[int], workdir: str) -> dict:
    """The measuring process: Spark, the Ray cluster, the fits, the shutdown, and which
    processes of the run are still alive 30 s after it."""
    import ray
    from ray.util.spark import shutdown_ray_cluster

    started = time.perf_counter()
    spark = start_spark()
    result = {"spark_s": time.perf_counter() - started}
    try:
        result["setup_s"] = setup_ray(os.path.join(workdir, "r"))
        started = time.perf_counter()
        ray.init()
        result["connect_s"] = time.perf_counter() - started
        result["rows"] = [world_row(np, runs, os.path.join(workdir, "out")) for np in worlds]
    finally:
        started = time.perf_counter()
        ray.shutdown()
        if "setup_s" in result:  # a failed setup shut its cluster down itself
            shutdown_ray_cluster()
        stop_spark(spark)
        result["shutdown_s"] = time.perf_counter() - started
    lingering, _ = still_alive(processes_of_run(workdir), timeout=30)
    result["alive_30s_after_shutdown"] = [f"{pid} {_cmdline(pid)[:160]}" for pid, _ in lingering]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="fits per world size (>= 2)")
    parser.add_argument("--np", type=int, nargs="+", default=[2, 8], help="world sizes")
    parser.add_argument("--measure-in", metavar="FOLDER", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.runs < 2 or any(np < 1 for np in args.np):
        parser.error("--runs must be at least 2 and every --np at least 1")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # no report home from a closed network
    # Ray on Spark starts its nodes with the `ray` command found on PATH.
    bin_dir = os.path.dirname(sys.executable)
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    if args.measure_in:
        print(json.dumps(measure(args.runs, args.np, args.measure_in)), flush=True)
        return
    # The measuring process is a child, so that what outlives it can be checked too.
    workdir = tempfile.mkdtemp(prefix="rs-")
    argv = [sys.executable, __file__, "--measure-in", workdir, "--runs", str(args.runs)]
    try:
        with MemorySampler(marker=workdir) as sampler:
            child = subprocess.run(argv + ["--np", *map(str, args.np)], stdout=subprocess.PIPE)
        left_over, waited = still_alive(list(sampler.seen), timeout=120)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    lines = [line for line in child.stdout.decode().splitlines() if line.startswith("{")]
    if child.returncode != 0 or not lines:
        raise SystemExit(f"the measuring process failed (exit status {child.returncode})")
    result = json.loads(lines[-1])
    result["peak_rss_mb"] = sampler.peak_rss / 1024**2
    result["processes_seen"] = len(sampler.seen)
    result["all_gone_s_after_exit"] = None if left_over else waited
    result["left_over_120s_after_exit"] = [f"{key[0]} {sampler.seen[key]}" for key in left_over]
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
