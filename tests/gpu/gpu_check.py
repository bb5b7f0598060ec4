"""`make gpu-check`: sparkdist on a GPU, checked in one run of a few minutes, on a machine
with torch (and CUDA) but no Java and no pyspark.

    python tests/gpu/gpu_check.py [--table gpu-check.txt] [--only 1,5]

Every job runs its ranks as processes of this driver (`np < 0`, the direct launcher), which
needs neither Spark nor Java. What the machine lacks of sparkdist's own needs (cloudpickle,
psutil, numpy, pyarrow) is installed from the wheels `make gpu-wheels` put in
`.gpu-wheels/`, and only if an import fails. Without the `cryptography` package the jobs
run without TLS (`SPARKDIST_TLS=0`): every channel is on 127.0.0.1 of this one machine.

Each check runs in a child process of its own with a time limit, so a hung collective
costs its check, not the run. A check that needs CUDA is reported "skipped (no CUDA)" on a
machine without it; the parts that run on CPU (gloo, CPU tensors) run everywhere, so CI
keeps the harness itself working. The table (check, result, figure) is printed and
written to `--table`; the exit status is 1 if any check failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
WHEELS = ROOT / ".gpu-wheels"
NEEDED = ("cloudpickle", "psutil", "numpy", "pyarrow")
"""What sparkdist's driver and ranks import for an `np < 0` job, besides torch."""
SKIPPED = "skipped (no CUDA)"
BUDGET_S = 450.0
"""The run's limit: every check is cut short so that the whole ends within it (8 minutes
with the start and the table)."""
MIN_LIMIT_S = 20.0
"""A check given less time than this is not started."""


@dataclass(frozen=True)
class Check:
    key: str
    name: str
    cuda: bool
    limit_s: float


CHECKS = [
    Check("1a", "1 DDP gloo, 2 ranks, CPU (the reference)", False, 120),
    Check("1b", "1 DDP NCCL, 1 rank, CUDA = CPU", True, 120),
    Check("1c", "1 DDP gloo, 2 ranks, CUDA tensors = CPU", True, 120),
    Check("2a", "2 elastic.run kill/restore/sync/grow, CPU", False, 180),
    Check("2b", "2 elastic.run kill/restore/sync/grow, CUDA (gloo)", True, 180),
    Check("3a", "3 ShardedTorchState FSDP2, gloo, 2 ranks, CPU", False, 150),
    Check("3b", "3 ShardedTorchState FSDP2, NCCL, 1 rank, CUDA", True, 150),
    Check("4a", "4 sharded DCP save/reshard/load, CPU", False, 150),
    Check("4b", "4 sharded DCP save/reshard/load, CUDA (gloo, 2 ranks)", True, 150),
    Check("5a", "5 the feed, GB/s, CPU (benchmarks/gpu_feed.py)", False, 150),
    Check("5b", "5 the feed into the GPU, GB/s (benchmarks/gpu_feed.py)", True, 150),
    Check("6", "6 CUDA_VISIBLE_DEVICES, 2 ranks on the driver's GPU 0", False, 120),
    Check("7", "7 NCCL flight recorder and abort, 1 rank", True, 120),
    Check("8a", "commit cost, CPU model (benchmarks/gpu_commit.py)", False, 150),
    Check("8b", "commit cost, 100M params on the GPU (benchmarks/gpu_commit.py)", True, 240),
    Check("9", "9 NCCL stall: flight recorder dump, the torchfrtrace command", True, 90),
    Check("10a", "10 warm world: 2 runs, one process, gloo, CPU", False, 120),
    Check("10b", "10 warm world: NCCL, kept tensor, cache freed, CUDA", True, 120),
    Check("10c", "10 warm world: NCCL group and communicator kept, warm run ms", True, 90),
    Check("11a", "11 a job's trace: no GPU counter on the CPU", False, 90),
    Check("11b", "11 a job's trace: GPU memory (and NVML) counters, CUDA", True, 90),
    Check("12", "12 GPT-2 step, 3 ways (benchmarks/gpu_train.py)", True, 150),
]


@dataclass
class Row:
    check: str
    result: str
    figure: str = ""


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def install_missing() -> list[str]:
    """Install what `NEEDED` names and this Python lacks, from `.gpu-wheels/` only."""
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if not missing:
        return []
    if not WHEELS.is_dir():
        raise SystemExit(
            f"gpu-check: {missing} missing and no {WHEELS}: run `make gpu-wheels` on a "
            "machine with a network, and carry .gpu-wheels with the tree"
        )
    pip = [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(WHEELS)]
    subprocess.run([*pip, *missing], check=True)
    return missing


def prepare_environment() -> None:
    """sparkdist from this tree, for this process and the ranks; TLS only if it can."""
    paths = [str(ROOT), str(HERE)]
    sys.path[:0] = [p for p in paths if p not in sys.path]
    existing = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([*paths, *([existing] if existing else [])])
    try:
        import cryptography.x509  # noqa: F401 - what the job's TLS certificate needs
    except ImportError:
        os.environ["SPARKDIST_TLS"] = "0"
    os.environ.setdefault("SPARKDIST_PROGRESS", "0")


def _benchmark(script: str, *args: str) -> str:
    """Run `benchmarks/<script>` (it prints its table, then one line of JSON: the figure)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        check=False,
    )
    print(done.stdout, end="", flush=True)
    if done.returncode != 0:
        raise RuntimeError(f"{script} exited {done.returncode}: {done.stderr[-600:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["figure"]


def run_check(key: str, work: Path) -> str:
    """Run check `key` in this process; its figure."""
    import cloudpickle
    import elastic_check
    import rank_checks
    import stall_check
    import trace_check
    import warm_check

    for module in (rank_checks, warm_check, trace_check):  # the ranks need not import them
        cloudpickle.register_pickle_by_value(module)
    store = work / "store"
    table = {
        "1a": lambda: rank_checks.check_ddp(2, "cpu", "gloo"),
        "1b": lambda: rank_checks.check_ddp(1, "cuda", "nccl"),
        "1c": lambda: rank_checks.check_ddp(2, "cuda", "gloo"),
        "2a": lambda: elastic_check.check_elastic("cpu", work / "elastic"),
        "2b": lambda: elastic_check.check_elastic("cuda", work / "elastic"),
        "3a": lambda: rank_checks.check_fsdp(2, "cpu", "gloo", store),
        "3b": lambda: rank_checks.check_fsdp(1, "cuda", "nccl", store),
        "4a": lambda: rank_checks.check_dcp(2, "cpu", "gloo", store),
        "4b": lambda: rank_checks.check_dcp(2, "cuda", "gloo", store),
        "5a": lambda: _benchmark("gpu_feed.py", "--device", "cpu", "--rows", "20000"),
        # 1 decode thread and 8 of the GPU machine's 16 cores (issue 61: the cores in parallel)
        "5b": lambda: _benchmark("gpu_feed.py", "--device", "cuda", "--workers", "1,8"),
        "6": lambda: rank_checks.check_pinning(has_cuda()),
        "7": rank_checks.check_nccl,
        "8a": lambda: _benchmark("gpu_commit.py", "--device", "cpu", "--params", "4M"),
        "8b": lambda: _benchmark("gpu_commit.py", "--device", "cuda", "--params", "100M"),
        "9": stall_check.check_nccl_stall,
        "10a": lambda: warm_check.check_warm("cpu"),
        "10b": lambda: warm_check.check_warm("cuda"),
        "10c": warm_check.check_kept_nccl,
        "11a": lambda: trace_check.check_trace("cpu"),
        "11b": lambda: trace_check.check_trace("cuda"),
        # eager and few steps to fit the budget; the full run compiles (docs/gpu.md)
        "12": lambda: _benchmark("gpu_train.py", "--no-compile", "--steps", "20", "--warmup", "3"),
    }
    return table[key]()


def run_in_child(check: Check, work: Path) -> Row:
    """Run `check` in a child process (its own session) within its time limit."""
    row_file = work / f"row-{check.key}.json"
    argv = [sys.executable, __file__, "--child", check.key, "--work", str(work)]
    began = time.monotonic()
    child = subprocess.Popen(argv, start_new_session=True)
    try:
        child.wait(timeout=check.limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        return Row(check.name, f"failed: timed out after {check.limit_s:.0f} s")
    took = time.monotonic() - began
    if not row_file.exists():
        return Row(check.name, f"failed: the check's process exited {child.returncode}")
    row = Row(**json.loads(row_file.read_text()))
    row.figure = f"{row.figure} [{took:.0f} s]" if row.figure else f"[{took:.0f} s]"
    return row


def child_main(key: str, work: Path) -> None:
    """What `--child` runs: one check; its row as JSON in the work directory."""
    check = next(c for c in CHECKS if c.key == key)
    try:
        row = Row(check.name, "passed", run_check(key, work / f"check-{key}"))
    except Exception as exc:  # noqa: BLE001 - a failed check is a row of the table
        import traceback

        traceback.print_exc()
        row = Row(check.name, f"failed: {type(exc).__name__}: {exc}"[:300])
    (work / f"row-{key}.json").write_text(json.dumps(asdict(row)))


def format_table(rows: list[Row]) -> str:
    every = [Row("check", "result", "figure"), *rows]
    widths = [max(len(getattr(row, name)) for row in every) for name in ("check", "result")]
    lines = []
    for row in every:
        lines.append(f"{row.check:<{widths[0]}}  {row.result:<{widths[1]}}  {row.figure}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", default="gpu-check.txt", help="where to write the table")
    parser.add_argument("--only", default="", help="check keys, comma separated (1a,5b,...)")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=BUDGET_S,
        help="the whole run's time limit (seconds); checks share it",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    prepare_environment()
    if args.child:
        child_main(args.child, Path(args.work))
        return 0
    installed = install_missing()
    cuda = has_cuda()
    wanted = [c for c in CHECKS if not args.only or c.key in args.only.split(",")]
    began, rows = time.monotonic(), []
    with tempfile.TemporaryDirectory(prefix="sparkdist-gpu-check-") as work:
        for check in wanted:
            left = args.budget_s - (time.monotonic() - began)
            if check.cuda and not cuda:
                rows.append(Row(check.name, SKIPPED))
            elif left < MIN_LIMIT_S:
                rows.append(Row(check.name, f"failed: not run, the {args.budget_s:.0f} s spent"))
            else:
                print(f"gpu-check: {check.name} ...", flush=True)
                limited = Check(check.key, check.name, check.cuda, min(check.limit_s, left))
                rows.append(run_in_child(limited, Path(work)))
    table = format_table(rows)
    device = _device_line(cuda)
    footer = (
        f"{device}; {time.monotonic() - began:.0f} s; installed from wheels: {installed or 'none'}"
    )
    text = table + footer + "\n"
    print("\n" + text, end="")
    Path(args.table).write_text(text)
    return 1 if any(row.result.startswith("failed") for row in rows) else 0


def _device_line(cuda: bool) -> str:
    import torch

    name = torch.cuda.get_device_name(0) if cuda else "no CUDA device"
    return f"torch {torch.__version__}, {name}, Python {sys.version.split()[0]}"


if __name__ == "__main__":
    sys.exit(main())
