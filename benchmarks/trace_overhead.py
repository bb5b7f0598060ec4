"""What the job's trace (issue 63) costs: a 1,000-step 2-rank job with the trace on and
off, the trace's size, and the per-call cost of the hooks it puts in a rank's loop.

Every sparkdist job records a trace: ranks buffer events (`sparkdist/protocol/
rank_trace.py`: a step per `sparkdist.report`, the loader's waits, commits and saves) and
send them with their signs of life once a second; the driver merges them
(`sparkdist/trace/recorder.py`) and writes trace.json. `HorovodRunner(trace=False)`
turns it off. Here:

* steps: a 2-rank job whose ranks each run STEPS steps of a small fixed compute (a
  float64 matmul, about 0.5 ms) and `sparkdist.report({"loss": x}, step=i)`; and the same
  with a batch from `make_numpy_batches` of a small converter each step (Parquet written
  by pyarrow, read in place: no Spark). `HorovodRunner(np=-2)` (the ranks on the driver);
  `--spark` adds np=2 on a local-cluster[2,1,1024] session. Trace on and off alternate
  job by job (on then off, then off then on, ...), `--rounds` jobs each after one warm-up,
  medians and min-max. The step loop is timed inside the ranks (`time.perf_counter`
  around it: launch noise stays out): rank 0's and the slowest rank's µs per step, and
  rank 0's CPU per step (its process's, threads included: steadier than wall time on a
  loaded machine); the whole job's wall time and the driver process's CPU time (for
  np=-2 its own, not the ranks') are shown beside them. The ranks run their BLAS on
  one thread (`OPENBLAS_NUM_THREADS=1`): OpenBLAS's spinning threads otherwise fight the
  driver for 2 cores and the steps swing from 1 to 20 ms.
* size: trace.json's bytes per 1,000 steps per rank, from the jobs above and from one
  `--size-steps` job (10,000 steps: past 1,024 slices a lane merges neighbours, so a
  long job's trace stops growing).
* hooks: `timeit` of `rank_trace.step("report", n)`, `rank_trace.data_wait(t0, t1)`
  for a short wait (under 0.1 ms: not recorded) and a long one, with recording on and
  off; a second's events pickled into a sign of life and unpickled (per event); and the
  driver's `JobTrace.rank_events` and end-of-job encoding per event.

    .venv/bin/python benchmarks/trace_overhead.py [--steps 1000] [--rounds 5] [--spark]
        [--size-steps 10000] [--no-batches]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
import timeit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_table  # noqa: E402 (a sibling script, not a package)

MATMUL_N = 200
"""The step's compute: a MATMUL_N x MATMUL_N float64 matmul on one thread (~0.5 ms)."""
BATCH_SIZE = 32
ROWS = 65_536
"""The converter's rows: 1,000 steps of 32 rows per rank on 2 ranks is one epoch."""
REPEAT = 21
"""timeit's timings per call, and the driver's per row."""
ONE_THREAD = {name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}


def steps_job(
    steps: int, n: int, converter=None, batch_size: int = BATCH_SIZE
) -> tuple[float, float]:
    """Wall and CPU seconds this rank spent in `steps` steps of an n x n matmul and a
    report (and, given a converter, a batch of `batch_size` rows first); the CPU is the
    process's, its threads' too (the loader's, the signs of life)."""
    import os
    import time

    import numpy as np

    import sparkdist

    a = np.random.default_rng(int(os.environ.get("RANK", "0"))).random((n, n)) / n
    if converter is None:
        cpu, started = time.process_time(), time.perf_counter()
        for step in range(steps):
            x = float((a @ a)[0, 0])
            sparkdist.report({"loss": x}, step=step)
        return time.perf_counter() - started, time.process_time() - cpu
    with converter.make_numpy_batches(batch_size=batch_size, num_epochs=None) as batches:
        batches = iter(batches)
        cpu, started = time.process_time(), time.perf_counter()
        for step in range(steps):
            batch = next(batches)
            x = float((a @ a)[0, 0]) + float(batch["x"][0])
            sparkdist.report({"loss": x}, step=step)
        return time.perf_counter() - started, time.process_time() - cpu


def small_converter(directory: str):
    """A converter of ROWS rows (a float and an int) in 4 Parquet files written by
    pyarrow, read in place: what `make_spark_converter` of a Parquet scan gives, no Spark."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparkdist.data.converter import SparkDatasetConverter
    from sparkdist.data.layout import describe

    per_file = ROWS // 4
    for index in range(4):
        ids = np.arange(index * per_file, (index + 1) * per_file, dtype=np.int64)
        table = pa.table({"x": (ids % 97).astype(np.float32), "y": ids})
        pq.write_table(table, os.path.join(directory, f"part-{index}.parquet"), row_group_size=4096)
    url = f"file://{os.path.abspath(directory)}"
    return SparkDatasetConverter(url, describe(url), source="parquet")


class Kind:
    """One kind of job (np, with or without batches) and what its runs measured."""

    def __init__(self, label: str, np: int, converter=None):
        self.label, self.np, self.converter = label, np, converter
        self.runs: dict[bool, list[dict]] = {True: [], False: []}

    def run(self, trace: bool, steps: int) -> dict:
        from sparkdist import HorovodRunner

        runner = HorovodRunner(np=self.np, trace=trace, env=ONE_THREAD)
        kwargs = {"steps": steps, "n": MATMUL_N}
        if self.converter is not None:
            kwargs["converter"] = self.converter
        cpu, started = time.process_time(), time.perf_counter()
        measured = runner.run_all(steps_job, **kwargs)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        path = runner.last_job.trace
        if trace and not path:
            raise AssertionError(f"{self.label}: the job wrote no trace")
        if not trace and path:
            raise AssertionError(f"{self.label}: trace=False wrote {path}")
        seconds = [wall_s for wall_s, _ in measured]
        return {
            "rank0_us": seconds[0] / steps * 1e6,
            "slowest_us": max(seconds) / steps * 1e6,
            "rank0_cpu_us": measured[0][1] / steps * 1e6,
            "wall_s": wall,
            "driver_cpu_s": cpu,
            "bytes": os.path.getsize(path) if path else None,
            "ranks": len(seconds),
            "steps": steps,
        }


def interleave(kinds: list[Kind], steps: int, rounds: int) -> None:
    """One warm-up job per kind and mode, then `rounds` rounds: in each, every kind runs
    with the trace on and off, the first alternating (on, off; then off, on; ...)."""
    for kind in kinds:
        for trace in (True, False):
            kind.run(trace, min(steps, 100))
    for round_ in range(rounds):
        for kind in kinds:
            for trace in (True, False) if round_ % 2 == 0 else (False, True):
                kind.runs[trace].append(kind.run(trace, steps))
        last = ", ".join(
            f"{k.label} on {k.runs[True][-1]['rank0_us']:.0f} "
            f"off {k.runs[False][-1]['rank0_us']:.0f}"
            for k in kinds
        )
        print(f"  round {round_ + 1}/{rounds} (rank 0 µs/step): {last}", flush=True)


MEASURES = (
    ("rank0_us", "rank 0 µs/step", "{:,.0f}"),
    ("slowest_us", "slowest rank µs/step", "{:,.0f}"),
    ("rank0_cpu_us", "rank 0 CPU µs/step", "{:,.0f}"),
    ("wall_s", "job wall s", "{:.2f}"),
    ("driver_cpu_s", "driver CPU s", "{:.2f}"),
)


def print_steps_table(kinds: list[Kind], steps: int, rounds: int) -> None:
    title = (
        f"Trace on against off: {steps:,} steps per rank (a {MATMUL_N}x{MATMUL_N} matmul and "
        f"a report each), 2 ranks, {rounds} jobs per mode interleaved: medians and min-max"
    )
    columns = ["job", "measure", "trace on", "on min-max", "trace off", "off min-max", "on/off"]
    rows = []
    for kind in kinds:
        for key, name, form in MEASURES:
            on = [run[key] for run in kind.runs[True]]
            off = [run[key] for run in kind.runs[False]]
            on_median, off_median = statistics.median(on), statistics.median(off)
            rows.append(
                [
                    kind.label,
                    name,
                    form.format(on_median),
                    f"{form.format(min(on))}-{form.format(max(on))}",
                    form.format(off_median),
                    f"{form.format(min(off))}-{form.format(max(off))}",
                    f"{on_median / off_median:.3f}x",
                ]
            )
    bench_table.print_table("steps", title, columns, rows)


def size_row(label: str, runs: list[dict]) -> list:
    sizes = [run["bytes"] for run in runs]
    ranks, steps = runs[0]["ranks"], runs[0]["steps"]
    size = statistics.median(sizes)
    return [label, f"{steps:,}", ranks, f"{size:,.0f}", f"{size / ranks / (steps / 1000):,.0f}"]


def print_size_table(kinds: list[Kind], long_runs: list[tuple[str, dict]]) -> None:
    rows = [size_row(kind.label, kind.runs[True]) for kind in kinds]
    rows += [size_row(label, [run]) for label, run in long_runs]
    title = "The trace's size: trace.json (median of the jobs with the trace on)"
    columns = ["job", "steps per rank", "ranks", "trace.json bytes", "bytes per 1,000 steps/rank"]
    bench_table.print_table("size", title, columns, rows)


# --- the hooks, one call at a time ---------------------------------------------------------


def per_call_ns(statement: str, names: dict, number: int, repeat: int = REPEAT) -> tuple:
    """(median, min) ns per call of `statement` over `repeat` timings of `number` calls,
    the rank's buffer emptied before each (as a sign of life empties it once a second)
    and the garbage collector on (timeit's default turns it off; the buffered events are
    what it has to walk)."""
    from sparkdist.protocol import rank_trace

    def setup() -> None:
        rank_trace._events.clear()
        gc.enable()

    timer = timeit.Timer(statement, setup=setup, globals=names)
    times = [t / number * 1e9 for t in timer.repeat(repeat=repeat, number=number)]
    rank_trace._events.clear()
    return statistics.median(times), min(times)


def hook_rows(number: int) -> list[list]:
    from sparkdist.protocol import rank_trace

    rows = []
    names = {"rank_trace": rank_trace, "noop": lambda *args: None, "t0": 1000.0}
    calls = [
        ("rank_trace.step('report', n)", "rank_trace.step('report', 7)", True),
        ("rank_trace.data_wait(t0, t1), 50 µs wait", "rank_trace.data_wait(t0, t0 + 5e-5)", False),
        ("rank_trace.data_wait(t0, t1), 1 ms wait", "rank_trace.data_wait(t0, t0 + 1e-3)", True),
    ]
    try:
        for on in (True, False):
            now = time.monotonic()
            rank_trace.start(0.0 if on else -1.0, now, now)
            for name, statement, recorded in calls:
                median, low = per_call_ns(statement, names, number)
                rows.append([name, "on" if on else "off", "yes" if on and recorded else "no"])
                rows[-1] += [round(median, 1), round(low, 1)]
    finally:
        rank_trace.start(-1.0, 0.0, 0.0)  # recording off, as outside a rank
    median, low = per_call_ns("noop(1, 2)", names, number)
    rows.append(["an empty Python call (the floor)", "-", "no", round(median, 1), round(low, 1)])
    return rows + sign_of_life_rows()


def recorded_steps(count: int) -> list[tuple]:
    """`count` step events as `rank_trace` records them (recording on, then off again)."""
    from sparkdist.protocol import rank_trace

    now = time.monotonic()
    rank_trace.start(0.0, now, now)
    try:
        for step in range(count):
            rank_trace.step("report", step)
        return rank_trace.drain()
    finally:
        rank_trace.start(-1.0, 0.0, 0.0)


def sign_of_life_rows(count: int = 1000, repeat: int = REPEAT) -> list[list]:
    """A second's worth of step events (1 ms steps) on the wire, per event: the rank
    pickles them into its sign of life, the driver unpickles them (as `wire` does; the
    MAC and TLS over the bytes are not counted)."""
    import pickle

    from sparkdist.protocol import messages

    message = messages.encode(messages.Alive({"batches": count}, recorded_steps(count)))
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    rows = []
    for name, side, statement in (
        ("pickle.dumps", "rank", lambda: pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)),
        ("pickle.loads", "driver", lambda: pickle.loads(body)),
    ):
        runs = timeit.repeat(statement, number=10, repeat=repeat)
        times = [t / 10 / count * 1e9 for t in runs]
        label = f"sign of life, {name} of {count:,} step events ({len(body) / count:.0f} B each)"
        rows.append([label, side, "-", round(statistics.median(times), 1), round(min(times), 1)])
    return rows


def driver_rows(repeat: int = REPEAT) -> list[list]:
    """The driver's side, per event: `JobTrace.rank_events` of a second's worth of steps
    (1,000 events, as `rank_trace` records them) into a fresh trace and of 10,000 (the
    lane merging past 1,024 slices), and the end of a job (`to_dict` and the JSON
    encoding) of 2 ranks x 1,000 steps."""
    import json

    from sparkdist.trace.recorder import JobTrace

    rows = []
    for count in (1_000, 10_000):
        events = recorded_steps(count)
        times = []
        for _ in range(repeat):
            trace = JobTrace()
            started = time.perf_counter()
            trace.rank_events(0, events)
            times.append((time.perf_counter() - started) / count * 1e9)
        label = f"JobTrace.rank_events, {count:,} step events"
        rows.append(
            [label, "driver", "yes", round(statistics.median(times), 1), round(min(times), 1)]
        )
    trace = JobTrace()
    for rank in range(2):
        trace.rank_events(rank, recorded_steps(1000))
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        json.dumps(trace.to_dict(), separators=(",", ":"))
        times.append((time.perf_counter() - started) / 2000 * 1e9)
    label = "JobTrace.to_dict + json.dumps (job end), 2 x 1,000 steps"
    rows.append([label, "driver", "-", round(statistics.median(times), 1), round(min(times), 1)])
    return rows


def print_hooks_table(number: int) -> None:
    rows = hook_rows(number) + driver_rows()
    title = (
        f"The hooks, one call: ns per call (the driver's: per event), timeit of {number:,} "
        f"calls with the GC on, median and min of {REPEAT}"
    )
    columns = ["call", "recording", "recorded", "ns median", "ns min"]
    bench_table.print_table("hooks", title, columns, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="steps per rank per job")
    parser.add_argument("--rounds", type=int, default=5, help="jobs per mode and kind")
    parser.add_argument("--spark", action="store_true", help="also np=2 on local-cluster")
    parser.add_argument("--no-batches", action="store_true", help="no converter's batches")
    parser.add_argument(
        "--size-steps", type=int, default=10_000, help="one long job's steps for the size (0: none)"
    )
    parser.add_argument(
        "--timeit-number", type=int, default=1000, help="calls per timing (1,000: 1 ms steps)"
    )
    args = parser.parse_args()

    import sparkdist

    sparkdist.set_log_level("WARNING")
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="sparkdist-bench-trace-") as directory:
        converter = None if args.no_batches else small_converter(directory)
        kinds = [Kind("np=-2, steps", -2)]
        if converter is not None:
            kinds.append(Kind("np=-2, batches + steps", -2, converter))
        spark = None
        if args.spark:
            from sparkdist.spark.session import embedded_spark

            spark = embedded_spark(executors=2, app_name="sparkdist-bench-trace")
            kinds.append(Kind("np=2 (Spark), steps", 2))
            if converter is not None:
                kinds.append(Kind("np=2 (Spark), batches + steps", 2, converter))
        interleave(kinds, args.steps, args.rounds)
        long_runs = []
        if args.size_steps:
            label = f"{kinds[0].label}, one long job"
            long_runs.append((label, kinds[0].run(True, args.size_steps)))
        if spark is not None:
            spark.stop()
    print()
    print_steps_table(kinds, args.steps, args.rounds)
    print()
    print_size_table(kinds, long_runs)
    print()
    print_hooks_table(args.timeit_number)
    after = os.getloadavg()
    print(
        f"\nload average (1, 5, 15 min): {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start, "
        f"{after[0]:.2f} {after[1]:.2f} {after[2]:.2f} at the end"
    )


if __name__ == "__main__":
    main()
