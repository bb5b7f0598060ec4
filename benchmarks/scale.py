"""Launch time as the world grows: a trivial job at np 2, 8, 32 and 64, side by side.

Real processes on one warm local-cluster session (by default local-cluster[2,32,3072]: 64
task slots on however many cores the machine has). The job is plain Python (`main`
returns 1 and imports no framework), so what grows with np is each launcher's own start,
fan-in and teardown. Each np is timed with:

* sparkdist's mpi launcher (mpirun over the tasks' agents);
* sparkdist's direct launcher (each task starts its ranks);
* sparkdist's elastic gang (`min_np = max_np = np`, plain tasks seated by the job's gang,
  the default launcher);
* pyspark's TorchDistributor (`local_mode=False`, `num_processes=np`: one barrier task
  and one torchrun per rank).

TorchDistributor runs up to PEER_MAX_NP (32 by default): each of its ranks is a torchrun and
a worker that both import torch, and at np=64 those 128 processes ran a 24 GB machine out of
memory (the OOM killer took the session's JVM). Above it the table shows "-".

sparkdist's rows use at most MAX_TASKS tasks (`ranks_per_task = np / MAX_TASKS` above
it, so np=64 runs 2 ranks per task), TorchDistributor one task per rank, as it must.
Runs are interleaved (one run of every launcher at every np, then again, in the other
order), so that the machine's load between them hits all alike, and an untimed job first
starts the executors' Python workers for that np (otherwise the first launcher timed at a
new np pays for them alone: 9 of 34 s of an mpi job at np=32 here). Prints the median per
launcher and np, and mpi / direct.

    .venv/bin/python benchmarks/scale.py [--np 2,8,32,64] [--repeat 2] [--max-tasks 32]
        [--peer-max-np 32] [--master local-cluster[2,32,3072]] [--only REGEX]

Then the scale simulator's curve (`sparkdist/runner/simulator`: the driver's real service
and job state against simulated tasks and ranks speaking the real protocol, 8 ranks per
simulated host) at 16 to 1,024 ranks (`--simulated`): the driver's time, CPU, threads and
bytes sent.

`real_process_rows` returns the table's rows for a caller that adds its own sections.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_table  # noqa: E402 (sibling scripts, not a package)
from launch_overhead import time_one  # noqa: E402

from sparkdist.runner.simulator import curve as simulator  # noqa: E402

LAUNCHERS = ("sparkdist mpi", "sparkdist direct", "sparkdist elastic gang", "TorchDistributor")
DEFAULT_MASTER = "local-cluster[2,32,3072]"


def trivial_job() -> int:
    """Imports nothing, so a run measures the launcher alone."""
    return 1


@dataclass
class ScaleRow:
    """One np: every launcher's wall times (seconds), in run order."""

    np: int
    ranks_per_task: int
    times: dict[str, list[float]] = field(default_factory=dict)

    def median(self, launcher: str) -> float | None:
        runs = self.times.get(launcher)
        return statistics.median(runs) if runs else None


def ranks_per_task(np: int, max_tasks: int) -> int:
    """The fewest ranks per task that keep a job at or under `max_tasks` tasks."""
    per_task = -(-np // max_tasks)
    if np % per_task:
        raise ValueError(f"np={np} does not split into tasks of {per_task} ranks")
    return per_task


def contenders(np: int, per_task: int, peer_max_np: int) -> dict[str, Callable[[], object]]:
    """What to time at one np, by launcher name (TorchDistributor up to `peer_max_np`)."""
    from pyspark.ml.torch.distributor import TorchDistributor

    from sparkdist import HorovodRunner

    def sparkdist_run(**options):
        return lambda: HorovodRunner(np=np, ranks_per_task=per_task, **options).run(trivial_job)

    runs = {
        "sparkdist mpi": sparkdist_run(launcher="mpi"),
        "sparkdist direct": sparkdist_run(launcher="direct"),
        "sparkdist elastic gang": sparkdist_run(min_np=np, max_np=np),
    }
    if np <= peer_max_np:
        runs["TorchDistributor"] = lambda: TorchDistributor(
            num_processes=np, local_mode=False, use_gpu=False
        ).run(trivial_job)
    return runs


def warm_up(row: ScaleRow) -> None:
    """A direct-launcher job at `row`'s shape: the executors' Python workers for that
    many tasks are started (and Spark's code paths warm) before any timed run."""
    from sparkdist import HorovodRunner

    HorovodRunner(np=row.np, ranks_per_task=row.ranks_per_task, launcher="direct").run(trivial_job)


def real_process_rows(
    nps: Sequence[int],
    repeat: int = 2,
    max_tasks: int = 32,
    only: str | None = None,
    peer_max_np: int = 32,
) -> list[ScaleRow]:
    """Time a trivial job `repeat` times per launcher and np on the active (or a new,
    local-cluster) session, interleaved; one row per np."""
    rows = [ScaleRow(np, ranks_per_task(np, max_tasks)) for np in nps]
    runs = {
        row.np: {
            name: fn
            for name, fn in contenders(row.np, row.ranks_per_task, peer_max_np).items()
            if not only or re.search(only, name)
        }
        for row in rows
    }
    for round_ in range(repeat):
        for row in rows:
            # Untimed, first: whichever launcher ran first at a new np would pay for
            # starting the executors' extra Python workers (seconds at np=32) alone.
            warm_up(row)
            order = list(runs[row.np].items())
            for name, fn in order if round_ % 2 == 0 else order[::-1]:
                seconds = time_one(fn, expected=(1, [1] * row.np))
                row.times.setdefault(name, []).append(seconds)
                print(f"  round {round_ + 1}, np={row.np}, {name}: {seconds:.2f}s", flush=True)
    return rows


REAL_COLUMNS = (
    "np",
    "ranks per task",
    "mpi s",
    "direct s",
    "mpi / direct",
    "elastic gang s",
    "TorchDistributor s",
)


def format_rows(rows: Sequence[ScaleRow], repeat: int) -> str:
    """The side-by-side table (median seconds) of `real_process_rows`."""

    def cell(value: float | None) -> str:
        return f"{value:>10.2f}" if value is not None else f"{'-':>10}"

    lines = [
        f"Trivial plain-Python job, median of {repeat} interleaved runs, warm session",
        f"{'np':>4} {'per task':>8} {'mpi':>10} {'direct':>10} {'mpi/direct':>10}"
        f" {'elastic':>10} {'TorchDistributor':>17}",
    ]
    for row in rows:
        mpi, direct = row.median("sparkdist mpi"), row.median("sparkdist direct")
        ratio = f"{mpi / direct:>9.2f}x" if mpi and direct else f"{'-':>10}"
        lines.append(
            f"{row.np:>4} {row.ranks_per_task:>8} {cell(mpi)} {cell(direct)} {ratio}"
            f" {cell(row.median('sparkdist elastic gang'))}"
            f" {cell(row.median('TorchDistributor')):>17}"
        )
    return "\n".join(lines)


def table_rows(rows: Sequence[ScaleRow]) -> list[list]:
    """`format_rows`'s cells as numbers (None where the table shows "-"), for the JSON."""
    out = []
    for row in rows:
        mpi, direct = row.median("sparkdist mpi"), row.median("sparkdist direct")
        out.append(
            [
                row.np,
                row.ranks_per_task,
                mpi,
                direct,
                mpi / direct if mpi and direct else None,
                row.median("sparkdist elastic gang"),
                row.median("TorchDistributor"),
            ]
        )
    return out


def print_simulated(ranks: Sequence[int]) -> None:
    """The simulator's curve, printed as `sparkdist.runner.simulator` prints it, and its
    two tables (the curve, the driver's CPU by phase) kept as JSON."""
    measurements = simulator.curve(ranks)
    text = io.StringIO()
    simulator.print_table(measurements, text)
    columns = list(simulator.COLUMNS)
    cells = [simulator.row_cells(m) for m in measurements]
    title = "The scale simulator: the driver's real service, simulated tasks and ranks"
    bench_table.print_table("simulator", title, columns, cells, text=text.getvalue().rstrip("\n"))
    phases = ("form", "lines", "collect", "payloads")
    by_phase = [[m.ranks, *(m.phase_cpu_s.get(p, 0.0) for p in phases)] for m in measurements]
    phase_columns = ["ranks", *(f"driver CPU s: {p}" for p in phases)]
    bench_table.write_table("simulator cpu by phase", title, phase_columns, by_phase)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--np", default="2,8,32,64", help="comma-separated world sizes ('' for none)"
    )
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--max-tasks", type=int, default=32, help="most tasks of a sparkdist job (more ranks each)"
    )
    parser.add_argument(
        "--peer-max-np", type=int, default=32, help="largest np TorchDistributor runs at"
    )
    parser.add_argument("--master", default=DEFAULT_MASTER)
    parser.add_argument("--only", metavar="REGEX", help="only the launchers whose name matches")
    parser.add_argument(
        "--simulated",
        default=",".join(map(str, simulator.CURVE_RANKS)),
        help="world sizes of the simulator's curve, comma-separated ('' for none)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    nps = [int(n) for n in args.np.split(",") if n]
    if nps:
        print_real_processes(args, nps)
    if args.simulated:
        print("\nThe scale simulator: the driver's real service, simulated tasks and ranks")
        print_simulated([int(n) for n in args.simulated.split(",")])


def print_real_processes(args: argparse.Namespace, nps: list[int]) -> None:
    """The real-process rows on a local-cluster session of `args.master`."""
    from sparkdist.spark.session import embedded_spark

    spark = embedded_spark(master=args.master, app_name="sparkdist-scale")
    rows = real_process_rows(nps, args.repeat, args.max_tasks, args.only, args.peer_max_np)
    spark.stop()
    print()
    print(f"Real processes on {args.master}")
    text = format_rows(rows, args.repeat)
    title = f"Real processes on {args.master}: " + text.splitlines()[0]
    bench_table.print_table("real processes", title, REAL_COLUMNS, table_rows(rows), text=text)


if __name__ == "__main__":
    main()
