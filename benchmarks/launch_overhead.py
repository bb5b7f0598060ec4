"""Launch overhead: a trivial 2-rank torch job, sparkdist side by side with its peers.

On one warm local-cluster[2,1,1024] session, times REPEAT runs each of a job that
initialises the process group, does one allreduce and returns a float, with:

* sparkdist HorovodRunner: mpi and direct launchers, np=2 (cluster) and np=-2 (driver);
* pyspark's TorchDistributor, local_mode False and True;
* horovod.spark.run (Gloo), where Horovod is installed.

Prints the median and min per launcher and the ratio to TorchDistributor(local_mode=False).

    .venv/bin/python benchmarks/launch_overhead.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import statistics
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
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

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

    baseline = dict((n, m) for n, m, _ in rows).get("TorchDistributor local_mode=False")
    print()
    print(f"Trivial 2-rank torch job, {args.repeat} runs each, warm local-cluster[2,1,1024]")
    print(f"{'launcher':<40} {'median s':>9} {'min s':>7} {'x TorchDistributor':>19}")
    for name, median, best in rows:
        if median is None:
            print(f"{name:<40} {'n/a':>9}")
            continue
        ratio = f"{median / baseline:.2f}x" if baseline else "n/a"
        print(f"{name:<40} {median:>9.2f} {best:>7.2f} {ratio:>19}")
    spark.stop()


if __name__ == "__main__":
    main()
