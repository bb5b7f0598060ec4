"""What "where each rank is" (issue 48) costs: a stack dump, a sign of life, and a job
that prints a lot, before and after.

    .venv/bin/python benchmarks/stall_costs.py [BEFORE_CHECKOUT] [--repeat 5]

Rows:
* `dump, 10 threads`: faulthandler's dump of a process holding 10 threads, in process
  (the time the rank's handler runs), and through `StackTaker.take` (signal, the bytes
  complete, the quiet period that says they are: what a supervisor waits), without
  py-spy (`SPARKDIST_PY_SPY=off`) and with it (its `dump --native` added, as
  `SPARKDIST_PY_SPY_NATIVE=1` asks), and with it
  on a process that imported torch (py-spy reads libtorch's symbols);
* `alive()`: one call of the loader's and commits' sign of life (no driver: the dict
  update and the clock read every call pays; the request once a second is not counted);
* `1,000 lines per rank`: a 2-rank job on the driver (np=-2, direct) whose ranks each
  print 1,000 lines: this checkout against BEFORE_CHECKOUT (each in a process with its
  own `PYTHONPATH`), interleaved run by run, medians.

The trivial job's launch overhead is `benchmarks/launch_compare.py BEFORE AFTER`.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import bench_table  # a sibling script, not a package

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HOLDER = textwrap.dedent(
    """
    import os, sys, threading
    from sparkdist.protocol import stack_dumps

    def hold(event):
        event.wait()

    if sys.argv[1] == "torch":
        import torch
    stack_dumps.listen(os.environ, 0)
    for _ in range(9):
        threading.Thread(target=hold, args=(threading.Event(),), daemon=True).start()
    print("ready", flush=True)
    hold(threading.Event())
    """
)

JOB = textwrap.dedent(
    """
    import sys, time
    from sparkdist import HorovodRunner

    def main(lines):
        for i in range(lines):
            print(f"line {i} of this rank's output", flush=True)
        return lines

    started = time.monotonic()
    HorovodRunner(np=-2, launcher="direct").run(main, lines=1000)
    print(f"SECONDS {time.monotonic() - started:.3f}", file=sys.stderr)
    """
)


def dump_in_process(repeat: int) -> float:
    """Median seconds of one all-threads dump in this process with 10 threads."""
    events = [threading.Event() for _ in range(9)]
    for event in events:
        threading.Thread(target=event.wait, daemon=True).start()
    times = []
    with open(os.devnull, "w") as sink:
        for _ in range(repeat):
            started = time.perf_counter()
            faulthandler.dump_traceback(file=sink, all_threads=True)
            times.append(time.perf_counter() - started)
    for event in events:
        event.set()
    return statistics.median(times)


def dump_by_supervisor(repeat: int, py_spy: str = "", torch: bool = False) -> float:
    """Median seconds of `StackTaker.take` on a process holding 10 threads (`py_spy`:
    `SPARKDIST_PY_SPY`'s value, "" to look it up; `torch`: the process imports it)."""
    from sparkdist.protocol.stack_dumps import StackTaker

    taker = StackTaker({**os.environ, "SPARKDIST_PY_SPY": py_spy, "SPARKDIST_PY_SPY_NATIVE": "1"})
    if py_spy != "off" and taker.py_spy is None:
        raise RuntimeError("py-spy is not installed (requirements/lock.txt)")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as script:
        script.write(HOLDER)
    env = {**os.environ, "PYTHONPATH": ROOT, **taker.rank_env(os.environ)}
    what = "torch" if torch else "plain"
    proc = subprocess.Popen([sys.executable, script.name, what], env=env, stdout=subprocess.PIPE)
    try:
        proc.stdout.readline()
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            text, _ = taker.take(proc.pid, nccl=False)
            times.append(time.perf_counter() - started)
            assert text.count("Thread 0x") + text.count("Current thread") >= 10, text
            assert ("native stacks (py-spy" in text) == (py_spy != "off"), text
        return statistics.median(times)
    finally:
        proc.kill()
        proc.wait()
        taker.close()
        os.unlink(script.name)


def alive_call(calls: int = 1_000_000) -> float:
    """Seconds per `driver_channel.alive` call outside a job."""
    from sparkdist.protocol.driver_channel import alive

    started = time.perf_counter()
    for _ in range(calls):
        alive("batches")
    return (time.perf_counter() - started) / calls


def lines_job(checkout: str) -> float:
    env = {**os.environ, "PYTHONPATH": checkout}
    done = subprocess.run(
        [sys.executable, "-c", JOB], env=env, capture_output=True, text=True, cwd=checkout
    )
    seconds = [line for line in done.stderr.splitlines() if line.startswith("SECONDS ")]
    if done.returncode != 0 or not seconds:
        raise RuntimeError(done.stderr[-2000:])
    return float(seconds[-1].split()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", nargs="?", help="the checkout to compare the job with")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    cells = []

    def row(label: str, value: float, unit: str, digits: int) -> None:
        """Print one row as it is measured, and keep it for the JSON."""
        width = 11 if unit in ("ms", "ns") else 12
        print(f"{label:42} {value:{width}.{digits}f}" + (f" {unit}" if unit else ""))
        cells.append([label.strip(), value, unit])

    print(f"{'row':42} {'value':>14}")
    row("dump, 10 threads, in process", dump_in_process(50) * 1e3, "ms", 3)
    row("dump, 10 threads, StackTaker.take", dump_by_supervisor(10, py_spy="off") * 1e3, "ms", 1)
    row("  the same with py-spy --native", dump_by_supervisor(10) * 1e3, "ms", 1)
    torch_rank = dump_by_supervisor(5, torch=True)
    row("  the same with py-spy, torch imported", torch_rank * 1e3, "ms", 1)
    row("alive() per call", alive_call() * 1e9, "ns", 0)
    if args.before:
        runs: dict[str, list[float]] = {"before": [], "after": []}
        for _ in range(args.repeat):
            for name, checkout in (("before", args.before), ("after", ROOT)):
                runs[name].append(lines_job(checkout))
        before, after = (statistics.median(runs[n]) for n in ("before", "after"))
        row("1,000 lines per rank, np=-2, before", before, "s", 2)
        row("1,000 lines per rank, np=-2, after", after, "s", 2)
        row("after / before", after / before, "", 3)
    title = "What a stack dump, a sign of life and a job that prints a lot cost"
    bench_table.write_table("costs", title, ["row", "value", "unit"], cells)


if __name__ == "__main__":
    main()
