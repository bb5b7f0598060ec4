"""Allreduce bandwidth inside ranks started by sparkdist vs the same code started by the
usual launchers (torchrun, horovodrun, mpirun) on this machine.

sparkdist only starts and wires the ranks; once they run, their data plane (Gloo, MPI)
must be exactly as fast as under the framework's own launcher. Each contender runs the
same worker function: WARMUP allreduces, then ITERS timed allreduces of a SIZE_MB
float32 tensor between 2 ranks, in BURSTS bursts between barriers; rank 0 reports the
algorithm bandwidth (bytes / time per allreduce) of the fastest burst. Contenders run
interleaved, REPEAT rounds, so that the machine's background load hits all of them
alike; the table shows the best and the median round and the ratio sparkdist / plain
launcher (>= 0.97 means sparkdist does not slow the data plane).

Workloads and their plain launchers:

* torch.distributed (Gloo):   torchrun --standalone --nproc_per_node 2
* Horovod, Gloo controller:   horovodrun --gloo -np 2
* Horovod, MPI controller:    horovodrun --mpi -np 2
* mpi4py Allreduce:           mpirun -np 2

sparkdist runs each on a local-cluster[2,1,1024] Spark (np=2, one rank per executor, so
two "hosts" talking TCP over loopback) and on the driver (np=-2). Everything stays on
127.0.0.1. Under MPI, np=2 is compared with mpirun using the same transport as two
hosts (`--mca pml ob1 --mca btl self,tcp`, loopback only), and np=-2 (all ranks on one
host, where sparkdist's mpirun adds shared memory) with plain mpirun / horovodrun and
the transports Open MPI picks on one host ("default transports" rows).

On a shared machine the numbers swing with other load; compare the best rounds, and
rerun when the ratios disagree with each other. Horovod swings by itself as well: its
Gloo controller between 0.6 and 1.1 GB/s from job to job here, and under plain mpirun
its MPI controller fell to 0.2 GB/s in 6 of 60 jobs (two busy-polling ranks sharing a
core), so its medians need many rounds.

Process layout matters as much as the transport: Linux's autogroup scheduler shares
the CPU per session, so sparkdist gives ranks the sessions their framework's launcher
gives them (see `sparkdist.runner.rank.supervisor.rank_in_own_session`).

    .venv/bin/python benchmarks/allreduce_bandwidth.py [--size-mb 4] [--iters 200]
        [--repeat 5] [--only torch,horovod-gloo,horovod-mpi,mpi4py]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable

import bench_table  # a sibling script, not a package

WARMUP = 10
BURSTS = 5
LOOPBACK_MPI = [
    "--mca",
    "pml",
    "ob1",
    "--mca",
    "btl",
    "self,tcp",
    "--mca",
    "btl_tcp_if_include",
    "127.0.0.0/8",
    "--mca",
    "oob_tcp_if_include",
    "127.0.0.0/8",
]


# --- the workers (the same code under every launcher) ---------------------------------------


def _time_allreduce(allreduce: Callable[[], None], barrier: Callable[[], None], iters: int):
    """Seconds per allreduce: the fastest of BURSTS bursts of iters / BURSTS allreduces,
    each between barriers, so that a spike of the machine's other load during one burst
    does not decide the result (the same rule for every launcher)."""
    for _ in range(WARMUP):
        allreduce()
    per_burst = max(iters // BURSTS, 1)
    best = float("inf")
    for _ in range(BURSTS):
        barrier()
        started = time.perf_counter()
        for _ in range(per_burst):
            allreduce()
        barrier()
        best = min(best, (time.perf_counter() - started) / per_burst)
    return best


def torch_worker(size_mb: float, iters: int) -> dict:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    tensor = torch.ones(int(size_mb * (1 << 20)) // 4, dtype=torch.float32)
    seconds = _time_allreduce(lambda: dist.all_reduce(tensor), dist.barrier, iters)
    result = _result(dist.get_rank(), dist.get_world_size(), tensor.numel() * 4, seconds)
    dist.destroy_process_group()
    return result


def horovod_worker(size_mb: float, iters: int) -> dict:
    import horovod.torch as hvd
    import torch

    torch.set_num_threads(1)
    hvd.init()
    tensor = torch.ones(int(size_mb * (1 << 20)) // 4, dtype=torch.float32)
    seconds = _time_allreduce(
        lambda: hvd.allreduce_(tensor, op=hvd.Sum, name="bw"),
        lambda: hvd.allreduce(torch.zeros(1), name="barrier"),
        iters,
    )
    controller = "mpi" if hvd.mpi_enabled() else "gloo"
    result = _result(hvd.rank(), hvd.size(), tensor.numel() * 4, seconds, controller=controller)
    hvd.shutdown()
    return result


def mpi4py_worker(size_mb: float, iters: int) -> dict:
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    send = np.ones(int(size_mb * (1 << 20)) // 4, dtype=np.float32)
    recv = np.empty_like(send)
    seconds = _time_allreduce(lambda: comm.Allreduce(send, recv), comm.Barrier, iters)
    return _result(comm.Get_rank(), comm.Get_size(), send.nbytes, seconds)


WORKERS = {"torch": torch_worker, "horovod": horovod_worker, "mpi4py": mpi4py_worker}


def _result(rank: int, size: int, nbytes: int, seconds: float, **extra) -> dict:
    return {
        "rank": rank,
        "size": size,
        "bytes": nbytes,
        "seconds": seconds,
        "gbps": nbytes / seconds / 1e9,
        **extra,
    }


def run_worker(name: str, size_mb: float, iters: int) -> dict:
    """Entry point of a rank (sparkdist's `main`)."""
    return WORKERS[name](size_mb, iters)


# --- the contenders ------------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{sysconfig.get_path('scripts')}{os.pathsep}{env.get('PATH', '')}"
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        GLOO_SOCKET_IFNAME="lo",
        PYTHONUNBUFFERED="1",
    )
    return env


def plain(argv_prefix: list[str], worker: str, args) -> Callable[[], float]:
    """A contender that starts this file's worker with a plain launcher."""
    command = [sys.executable, os.path.abspath(__file__), "--worker", worker]
    command += ["--size-mb", str(args.size_mb), "--iters", str(args.iters)]

    def run() -> float:
        proc = subprocess.run(
            argv_prefix + command, capture_output=True, text=True, env=_env(), timeout=600
        )
        # Only rank 0 prints; horovodrun prefixes its lines with "[0]<stdout>:".
        decoder = json.JSONDecoder()
        results = [
            decoder.raw_decode(line.split("RESULT ", 1)[1])[0]
            for line in proc.stdout.splitlines()
            if "RESULT " in line
        ]
        rank0 = [r for r in results if r["rank"] == 0]
        if proc.returncode != 0 or not rank0 or rank0[0]["size"] != 2:
            raise RuntimeError(
                f"{' '.join(argv_prefix)} failed (exit {proc.returncode}):\n"
                f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
            )
        return rank0[0]["gbps"]

    return run


def with_sparkdist(np: int, launcher: str, worker: str, args) -> Callable[[], float]:
    from sparkdist import HorovodRunner

    def run() -> float:
        runner = HorovodRunner(np=np, launcher=launcher, driver_log_verbosity="log_callback_only")
        result = runner.run(run_worker, name=worker, size_mb=args.size_mb, iters=args.iters)
        assert result["size"] == 2
        return result["gbps"]

    return run


def contenders(args) -> list[tuple[str, str, Callable[[], float]]]:
    """(workload, contender name, run) for every contender available here."""
    out: list[tuple[str, str, Callable[[], float]]] = []
    selected = set(args.only.split(","))
    have_mpirun = shutil.which("mpirun") is not None
    have_horovod = shutil.which("horovodrun", path=_env()["PATH"]) is not None
    have_mpi4py = _importable("mpi4py")
    hosts = ["-H", "localhost:2"]

    if "torch" in selected:
        torchrun = ["torchrun", "--standalone", "--nproc_per_node", "2", "--no-python"]
        out.append(("torch Gloo", "torchrun", plain(torchrun, "torch", args)))
        out.append(("torch Gloo", "sparkdist np=2", with_sparkdist(2, "direct", "torch", args)))
        out.append(("torch Gloo", "sparkdist np=-2", with_sparkdist(-2, "direct", "torch", args)))
    if "horovod-gloo" in selected and have_horovod:
        horovodrun = ["horovodrun", "--gloo", "-np", "2", *hosts, "--network-interfaces", "lo"]
        out.append(("Horovod Gloo", "horovodrun --gloo", plain(horovodrun, "horovod", args)))
        out.append(("Horovod Gloo", "sparkdist np=2", with_sparkdist(2, "direct", "horovod", args)))
        out.append(
            ("Horovod Gloo", "sparkdist np=-2", with_sparkdist(-2, "direct", "horovod", args))
        )
    mpirun = ["mpirun", "-np", "2", "--bind-to", "none", "--map-by", "slot"]
    if "horovod-mpi" in selected and have_horovod and have_mpirun:
        # horovodrun --mpi is mpirun plus Horovod's variables; it cannot be told to use
        # sparkdist's transports (it sets pml and btl itself), so the like-for-like
        # baseline is the mpirun command it would run, and horovodrun itself is shown
        # with the transports Open MPI picks on one host.
        horovodrun = [
            "horovodrun",
            "--mpi",
            "-np",
            "2",
            *hosts,
            "--network-interfaces",
            "lo",
            "--binding-args=--bind-to none --map-by slot",
        ]
        same = plain(mpirun + LOOPBACK_MPI, "horovod", args)
        out.append(("Horovod MPI", "mpirun (as horovodrun --mpi), TCP", same))
        out.append(("Horovod MPI", "sparkdist np=2", with_sparkdist(2, "mpi", "horovod", args)))
        out.append(("Horovod MPI", "sparkdist np=-2", with_sparkdist(-2, "mpi", "horovod", args)))
        default = plain(horovodrun, "horovod", args)
        out.append(("Horovod MPI", "horovodrun --mpi (default transports)", default))
    if "mpi4py" in selected and have_mpirun and have_mpi4py:
        out.append(
            ("mpi4py", "mpirun, TCP (as sparkdist)", plain(mpirun + LOOPBACK_MPI, "mpi4py", args))
        )
        out.append(("mpi4py", "sparkdist np=2", with_sparkdist(2, "mpi", "mpi4py", args)))
        out.append(("mpi4py", "sparkdist np=-2", with_sparkdist(-2, "mpi", "mpi4py", args)))
        out.append(("mpi4py", "mpirun (default transports)", plain(mpirun, "mpi4py", args)))
    return out


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def start_spark():
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .appName("sparkdist-allreduce-bandwidth")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executor.memory", "1g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def print_table(args, rows: dict[tuple[str, str], list[float]], order) -> None:
    title = (
        f"allreduce of {args.size_mb:g} MB float32 between 2 ranks, {args.iters} iterations "
        f"(+{WARMUP} warm-up), best and median of {args.repeat} interleaved rounds; "
        "GB/s = bytes / time per allreduce"
    )
    header = f"{'workload':<14} {'launcher':<40} {'best GB/s':>10} {'median':>8} {'ratio':>7}"
    lines = [f"\n{title}\n", header, "-" * len(header)]
    cells = []
    baseline: dict[str, tuple[float, float]] = {}
    for workload, name in order:
        values = rows[(workload, name)]
        best, median = max(values), statistics.median(values)
        if workload not in baseline:
            baseline[workload] = (best, median)
            ratio = "plain"
        elif name.startswith("sparkdist"):
            ratio = f"{best / max(rows[_baseline_of(workload, name, order)]):.3f}"
        else:
            ratio = ""
        lines.append(f"{workload:<14} {name:<40} {best:>10.3f} {median:>8.3f} {ratio:>7}")
        cells.append([workload, name, best, median, ratio])
    columns = ["workload", "launcher", "best GB/s", "median GB/s", "ratio"]
    bench_table.print_table("allreduce", title, columns, cells, text="\n".join(lines))
    print(
        "\nratio: sparkdist's best / its plain launcher's best (np=2: the first row of the "
        "workload; np=-2 under MPI: the default-transports row). Median ratios:"
    )
    for workload, name in order:
        if name.startswith("sparkdist"):
            base = rows[_baseline_of(workload, name, order)]
            ratio = statistics.median(rows[(workload, name)]) / statistics.median(base)
            vs = base_name(workload, name, order)
            print(f"  {workload:<14} {name:<18} {ratio:.3f}  (vs {vs})")


def _baseline_of(workload: str, name: str, order) -> tuple[str, str]:
    return (workload, base_name(workload, name, order))


def base_name(workload: str, name: str, order) -> str:
    """The plain launcher a sparkdist row is compared with: for ranks on one host
    (np=-2) under MPI, mpirun with its default transports (shared memory), as a user
    would run it there; otherwise the first row of the workload (same transports)."""
    names = [n for w, n in order if w == workload]
    if name.endswith("np=-2"):
        for candidate in names:
            if "default transports" in candidate:
                return candidate
    return names[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=4.0)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", default="torch,horovod-gloo,horovod-mpi,mpi4py")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:  # a rank started by a plain launcher
        result = run_worker(args.worker, args.size_mb, args.iters)
        if result["rank"] == 0:
            print("RESULT " + json.dumps(result), flush=True)
        return

    logging.basicConfig(level=logging.WARNING)
    spark = start_spark()
    try:
        entries = contenders(args)
        rows: dict[tuple[str, str], list[float]] = {(w, n): [] for w, n, _ in entries}
        for round_ in range(1, args.repeat + 1):
            for workload, name, run in entries:
                gbps = run()
                rows[(workload, name)].append(gbps)
                print(f"round {round_}: {workload:<14} {name:<40} {gbps:.3f} GB/s", flush=True)
        print_table(args, rows, [(w, n) for w, n, _ in entries])
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
