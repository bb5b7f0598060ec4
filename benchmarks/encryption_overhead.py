"""What TLS on the job's channels costs: launch time and checkpoint throughput, with
encryption on (the default) and off (`SPARKDIST_TLS=0`), side by side in one run.

On one warm local-cluster[2,1,1024] session, alternating on and off run by run (so a
change in the machine's load hits both alike):

* launch: the trivial 2-rank torch job of `launch_overhead.py` (init the process group,
  one allreduce, return a float), HorovodRunner(np=2) with the direct and mpi launchers;
* checkpoints: an np=2 job whose rank 0 saves a 100 MB state 10 times through
  `sparkdist.checkpoint.save` (to the driver, over the job's channel, into a
  checkpoint_dir on local disk); throughput is 1000 MB over the time of the 10 saves,
  measured in rank 0.

    .venv/bin/python benchmarks/encryption_overhead.py [--repeat 5] [--checkpoint-repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_table  # noqa: E402 (sibling scripts, not a package)
from launch_overhead import torch_job  # noqa: E402

from sparkdist.protocol.job_secret import TLS_ENV  # noqa: E402

STATE_MB = 100
SAVES = 10


def checkpoint_job(state_mb: int, saves: int) -> float:
    """Seconds rank 0 spent in `saves` saves of a `state_mb` MB state."""
    import os
    import time

    from sparkdist import checkpoint

    state = {"weights": os.urandom(state_mb << 20)}
    started = time.perf_counter()
    for step in range(saves):
        checkpoint.save(state, step)
    return time.perf_counter() - started


@contextlib.contextmanager
def tls(on: bool):
    before = os.environ.get(TLS_ENV)
    os.environ[TLS_ENV] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ[TLS_ENV]
        else:
            os.environ[TLS_ENV] = before


def alternate(run, repeat: int) -> dict[bool, list[float]]:
    """`repeat` values of run() per mode, on and off alternating (on first, then off first),
    after one warm-up each."""
    values: dict[bool, list[float]] = {True: [], False: []}
    for on in (True, False):
        with tls(on):
            run()
    for round_ in range(repeat):
        # Who goes first alternates, so that neither mode gains from the other's run.
        for on in (True, False) if round_ % 2 == 0 else (False, True):
            with tls(on), contextlib.redirect_stdout(io.StringIO()):
                values[on].append(run())
    return values


def timed(fn):
    def run() -> float:
        started = time.perf_counter()
        value = fn()
        if value != 3.0:
            raise AssertionError(f"wrong result {value!r}")
        return time.perf_counter() - started

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--checkpoint-repeat", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)

    from sparkdist import HorovodRunner
    from sparkdist.spark.session import embedded_spark

    spark = embedded_spark(executors=2, app_name="sparkdist-bench-tls")
    launch = {}
    for launcher in ("direct", "mpi"):
        runner = HorovodRunner(np=2, launcher=launcher)
        launch[launcher] = alternate(timed(lambda r=runner: r.run(torch_job)), args.repeat)
        print(f"  measured launch, {launcher}", flush=True)
    with tempfile.TemporaryDirectory(prefix="sparkdist-bench-ckpt-") as directory:
        runner = HorovodRunner(np=2, checkpoint_dir=directory)
        saves = alternate(
            lambda: runner.run(checkpoint_job, state_mb=STATE_MB, saves=SAVES),
            args.checkpoint_repeat,
        )
    spark.stop()

    print()
    print_launch_table(launch, args.repeat)
    print()
    rates = print_checkpoint_table(saves, args.checkpoint_repeat)
    print(f"throughput with TLS vs without: {100 * (rates[True] / rates[False] - 1):+.1f}%")


def print_launch_table(launch: dict, repeat: int) -> None:
    """The launch with TLS on and off, per launcher: medians, minimums, on vs off in %."""
    title = (
        f"Trivial 2-rank torch job, HorovodRunner(np=2), {repeat} runs per mode, "
        "alternating, warm local-cluster[2,1,1024]"
    )
    lines = [
        title,
        f"{'launcher':<12} {'TLS on median s':>16} {'TLS off median s':>17} {'on vs off':>10}"
        f" {'on min s':>9} {'off min s':>10} {'on vs off':>10}",
    ]
    cells = []
    for launcher, values in launch.items():
        on, off = statistics.median(values[True]), statistics.median(values[False])
        low_on, low_off = min(values[True]), min(values[False])
        low_ratio = 100 * (low_on / low_off - 1)
        lines.append(
            f"{launcher:<12} {on:>16.3f} {off:>17.3f} {100 * (on / off - 1):>+9.1f}%"
            f" {low_on:>9.3f} {low_off:>10.3f} {low_ratio:>+9.1f}%"
        )
        cells.append([launcher, on, off, 100 * (on / off - 1), low_on, low_off, low_ratio])
    columns = [
        "launcher",
        "TLS on median s",
        "TLS off median s",
        "on vs off median %",
        "on min s",
        "off min s",
        "on vs off min %",
    ]
    bench_table.print_table("launch", title, columns, cells, text="\n".join(lines))


def print_checkpoint_table(saves: dict, repeat: int) -> dict[bool, float]:
    """The checkpoint saves with TLS on and off; the median MB/s of each."""
    total = STATE_MB * SAVES
    title = (
        f"Checkpoints: {SAVES} saves of a {STATE_MB} MB state from rank 0 to the driver "
        f"(checkpoint_dir on local disk), {repeat} jobs per mode"
    )
    lines = [title, f"{'mode':<12} {'median s':>9} {'MB/s median':>12} {'MB/s best':>10}"]
    rates, cells = {}, []
    for on in (True, False):
        seconds = saves[on]
        rates[on] = total / statistics.median(seconds)
        mode = "TLS " + ("on" if on else "off")
        lines.append(
            f"{mode:<12} {statistics.median(seconds):>9.2f} "
            f"{rates[on]:>12.0f} {total / min(seconds):>10.0f}"
        )
        cells.append([mode, statistics.median(seconds), rates[on], total / min(seconds)])
    columns = ["mode", "median s", "MB/s median", "MB/s best"]
    bench_table.print_table("checkpoints", title, columns, cells, text="\n".join(lines))
    return rates


if __name__ == "__main__":
    main()
