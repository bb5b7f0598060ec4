"""Launch overhead of two checkouts of sparkdist, interleaved run by run in one run.

`launch_overhead.py` measures one checkout; comparing two of its runs mixes the change with
the machine's load between them. Here each checkout gets a worker process of its own
(`PYTHONPATH` set to it, so its driver, tasks and ranks run its code) holding a warm
local-cluster[2,1,1024] session, and the controller asks them in turn for one timed run of
the same row: before, after, after, before... A change in load hits both alike.

    .venv/bin/python benchmarks/launch_compare.py BEFORE_CHECKOUT AFTER_CHECKOUT
        [--repeat 15] [--only REGEX]

With no checkouts both workers run this one: an A/A run, whose ratios show how far apart
two identical checkouts come out (the comparison's noise floor).

Rows are `launch_overhead.py`'s classic-session rows (each checkout's own copy of that
script defines them); `--only` picks some (default: sparkdist's runner rows and pyspark's
TorchDistributor(local_mode=False)). Prints median and min per row and checkout and the
after/before ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import bench_table  # a sibling script, not a package

DEFAULT_ROWS = (
    r"^sparkdist (mpi|direct) np=-?2(, elastic 1..2)?$|^TorchDistributor local_mode=False$"
)


def serve(only: str) -> None:
    """The worker: answers each row name read on stdin with one run's seconds on stdout."""
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what jobs, Spark and ranks print stays off the answers
    sys.stdout = sys.stderr
    logging.basicConfig(level=logging.ERROR)
    sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
    import cloudpickle
    import launch_overhead
    from pyspark import cloudpickle as spark_cloudpickle

    # Jobs pickle launch_overhead's functions by value: executors cannot import it.
    cloudpickle.register_pickle_by_value(launch_overhead)
    spark_cloudpickle.register_pickle_by_value(launch_overhead)

    from sparkdist.spark.session import embedded_spark

    spark = embedded_spark(executors=2, app_name="sparkdist-launch-compare")
    rows = {
        name: fn for name, fn in launch_overhead.contenders(spark) if fn and re.search(only, name)
    }
    for fn in rows.values():
        fn()  # warm-up
    print(json.dumps(sorted(rows)), file=protocol, flush=True)
    for line in sys.stdin:
        fn = rows[line.strip()]
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            fn()
        print(f"{time.perf_counter() - started:.4f}", file=protocol, flush=True)
    spark.stop()


def _worker(checkout: str, only: str, log) -> subprocess.Popen:
    python = sys.executable
    env = dict(os.environ, PYTHONPATH=checkout, PYSPARK_PYTHON=python)
    env.update(PYSPARK_DRIVER_PYTHON=python, SPARK_LOCAL_IP="127.0.0.1")
    return subprocess.Popen(
        [python, os.path.abspath(__file__), "--serve", only],
        cwd=checkout,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )


def compare(checkouts: dict[str, str], only: str, repeat: int) -> None:
    log_path = os.path.join(tempfile.gettempdir(), "sparkdist-launch-compare.log")
    print(f"the workers' Spark and job output: {log_path}")
    log = open(log_path, "w")  # noqa: SIM115 (both workers write to it until they end)
    workers = {label: _worker(path, only, log) for label, path in checkouts.items()}
    names = [json.loads(w.stdout.readline()) for w in workers.values()]
    rows = [n for n in names[0] if all(n in other for other in names[1:])]
    times = {(label, row): [] for label in workers for row in rows}
    for round_ in range(repeat):
        for row in rows:
            # Who goes first alternates, so that neither gains from the other's run.
            for label, worker in list(workers.items())[:: 1 if round_ % 2 == 0 else -1]:
                worker.stdin.write(row + "\n")
                worker.stdin.flush()
                times[label, row].append(float(worker.stdout.readline()))
    for worker in workers.values():
        worker.stdin.close()
        worker.wait()
    log.close()
    before, after = list(checkouts)
    title = f"Trivial 2-rank torch job, {repeat} runs per row and checkout, interleaved"
    lines = [
        f"\n{title}",
        f"{'row':<36} {'before median':>14} {'after median':>13} {'ratio':>7}"
        f" {'before min':>11} {'after min':>10} {'ratio':>7}",
    ]
    cells = []
    for row in rows:
        b, a = times[before, row], times[after, row]
        mb, ma = statistics.median(b), statistics.median(a)
        lines.append(
            f"{row:<36} {mb:>14.3f} {ma:>13.3f} {ma / mb:>6.3f}x"
            f" {min(b):>11.3f} {min(a):>10.3f} {min(a) / min(b):>6.3f}x"
        )
        cells.append([row, mb, ma, ma / mb, min(b), min(a), min(a) / min(b)])
    columns = [
        "row",
        "before median s",
        "after median s",
        "median ratio",
        "before min s",
        "after min s",
        "min ratio",
    ]
    bench_table.print_table("compare", title, columns, cells, text="\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", nargs="?")
    parser.add_argument("after", nargs="?")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--only", default=DEFAULT_ROWS, metavar="REGEX")
    parser.add_argument("--serve", metavar="REGEX", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if bool(args.before) != bool(args.after):
        parser.error("give two checkouts (BEFORE AFTER), or none for an A/A run of this one")
    args.before, args.after = args.before or here, args.after or here
    compare(
        {"before": os.path.abspath(args.before), "after": os.path.abspath(args.after)},
        args.only,
        args.repeat,
    )


if __name__ == "__main__":
    main()
