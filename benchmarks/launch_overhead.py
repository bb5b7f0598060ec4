"""Launch overhead: a trivial 2-rank torch job, sparkdist side by side with its peers.

On one warm local-cluster[2,1,1024] session, times REPEAT runs each of a job that
initialises the process group, does one allreduce and returns a float, with:

* sparkdist HorovodRunner: mpi and direct launchers, np=2 (cluster) and np=-2 (driver);
* pyspark's TorchDistributor, local_mode False and True;
* horovod.spark.run (Gloo), where Horovod is installed;
* through a Spark Connect session (a LocalConnectServer over the same local-cluster shape,
  driven by a client process with no JVM): sparkdist np=2 with the executors reaching the
  client and in relay mode, and pyspark's TorchDistributor on the same Connect session.

Prints the median and min per launcher and the ratio to TorchDistributor(local_mode=False)
of the same kind of session.

    .venv/bin/python benchmarks/launch_overhead.py [--repeat 5] [--no-connect]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import statistics
import subprocess
import sys
import time


def torch_job() -> float:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    dist.destroy_process_group()
    return value.item()


def horovod_job() -> float:
    import horovod.torch as hvd
    import torch

    hvd.init()
    value = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    hvd.shutdown()
    return value.item()


def contenders(spark):
    from sparkdist import HorovodRunner

    def sparkdist_run(np, launcher):
        return lambda: HorovodRunner(np=np, launcher=launcher).run(torch_job)

    yield "sparkdist mpi np=2", sparkdist_run(2, "mpi")
    yield "sparkdist direct np=2", sparkdist_run(2, "direct")
    yield "sparkdist mpi np=-2", sparkdist_run(-2, "mpi")
    yield "sparkdist direct np=-2", sparkdist_run(-2, "direct")

    from pyspark.ml.torch.distributor import TorchDistributor

    def distributor(local_mode):
        return lambda: TorchDistributor(num_processes=2, local_mode=local_mode, use_gpu=False).run(
            torch_job
        )

    yield "TorchDistributor local_mode=False", distributor(False)
    yield "TorchDistributor local_mode=True", distributor(True)

    try:
        import horovod.spark
        import horovod.torch  # noqa: F401
    except ImportError as exc:
        yield f"horovod.spark.run (not installed: {exc})", None
    else:
        yield (
            "horovod.spark.run (gloo)",
            lambda: horovod.spark.run(horovod_job, num_proc=2, use_gloo=True, verbose=0),
        )


def connect_contenders():
    """The rows measured from a Spark Connect client (this script with --connect-client)."""
    from sparkdist import HorovodRunner

    def sparkdist_run(launcher, relay):
        def run():
            os.environ["SPARKDIST_CONNECT_RELAY"] = relay
            return HorovodRunner(np=2, launcher=launcher).run(torch_job)

        return run

    yield "Connect: sparkdist mpi np=2", sparkdist_run("mpi", "auto")
    yield "Connect: sparkdist direct np=2", sparkdist_run("direct", "auto")
    yield "Connect: sparkdist mpi np=2, relay mode", sparkdist_run("mpi", "always")
    yield "Connect: sparkdist direct np=2, relay mode", sparkdist_run("direct", "always")

    from pyspark.ml.torch.distributor import TorchDistributor

    yield (
        "Connect: TorchDistributor local_mode=False",
        lambda: TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(torch_job),
    )


def connect_client(url: str, repeat: int) -> None:
    from pyspark.sql import SparkSession

    SparkSession.builder.remote(url).getOrCreate()
    for name, fn in connect_contenders():
        times = measure(fn, repeat)
        print("ROW " + json.dumps([name, statistics.median(times), min(times)]), flush=True)


def connect_rows(repeat: int) -> list[tuple[str, float | None, float | None]]:
    """Start a Connect server and measure the Connect rows from a client process."""
    from sparkdist.connect_server import LocalConnectServer

    rows = []
    with LocalConnectServer() as server:
        proc = subprocess.run(
            [sys.executable, __file__, "--connect-client", server.url, "--repeat", str(repeat)],
            capture_output=True, text=True,
        )  # fmt: skip
    for line in proc.stdout.splitlines():
        if line.startswith("ROW "):
            name, median, best = json.loads(line[4:])
            rows.append((name, median, best))
            print(f"  measured {name}: median {median:.2f}s", flush=True)
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit("the Connect client failed")
    return rows


def measure(fn, repeat: int) -> list[float]:
    fn()  # warm-up: imports, JIT of Spark's code paths
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            value = fn()
        times.append(time.perf_counter() - started)
        if value not in (3.0, [3.0, 3.0]):
            raise AssertionError(f"wrong allreduce result {value!r}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-connect", action="store_true", help="skip the Spark Connect rows")
    parser.add_argument("--connect-client", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    if args.connect_client:
        connect_client(args.connect_client, args.repeat)
        return

    from sparkdist.session import embedded_spark

    spark = embedded_spark(executors=2, app_name="sparkdist-bench")
    rows = []
    for name, fn in contenders(spark):
        if fn is None:
            rows.append((name, None, None))
            continue
        times = measure(fn, args.repeat)
        rows.append((name, statistics.median(times), min(times)))
        print(f"  measured {name}: median {statistics.median(times):.2f}s", flush=True)

    spark.stop()
    if not args.no_connect:
        rows += connect_rows(args.repeat)

    medians = {n: m for n, m, _ in rows}
    print()
    print(f"Trivial 2-rank torch job, {args.repeat} runs each, warm local-cluster[2,1,1024]")
    print(f"{'launcher':<46} {'median s':>9} {'min s':>7} {'x TorchDistributor':>19}")
    for name, median, best in rows:
        if median is None:
            print(f"{name:<46} {'n/a':>9}")
            continue
        prefix = "Connect: " if name.startswith("Connect: ") else ""
        baseline = medians.get(f"{prefix}TorchDistributor local_mode=False")
        ratio = f"{median / baseline:.2f}x" if baseline else "n/a"
        print(f"{name:<46} {median:>9.2f} {best:>7.2f} {ratio:>19}")


if __name__ == "__main__":
    main()
