"""Recovery from a lost host: from a worker's loss to the next training step, in process
and by relaunch, for model states of several sizes, with the peers beside them.

On the namespaced standalone cluster of the multi-host tests (tests/cluster: three
hosts, a Spark worker each, built with network namespaces; needs root), one driver
application with one executor per host runs a 3-rank DDP regression that takes a step
every STEP_S seconds. After KILL_AFTER_STEP steps the benchmark SIGKILLs the Spark worker
of a host that does not run rank 0 (and everything under it, as when a host is lost) and
measures, from the loss:

* the time to the next training step of the world that went on;
* the steps redone (the old world's last recorded step minus the step the new world
  started from);
* the survivors' restarts (ranks of the new world whose processes are new).

Rows, each a fresh job (`min_np=2, max_np=3`, the launcher `auto`: direct):

* sparkdist in process (`sparkdist.elastic.run`, a commit every step): model states of
  `--sizes` parameters (float32; a frozen parameter of that size beside the trained ones,
  so a step stays short: committed, restored and synced like any other);
* sparkdist relaunch (no `elastic.run`: a checkpoint every SAVE_EVERY steps through the
  driver, the world relaunched from it), the same sizes (or `--relaunch-sizes`);
* sparkdist fixed size (`np=3, max_failures=1`): relaunched once a replacement worker
  arrives `--replacement-s` after the loss;
* pyspark's TorchDistributor (np=3): the barrier stage fails; the time is to the error;
* `horovod.spark.run_elastic` (Gloo, `hvd.elastic.run`, a commit every step).

`--notice` runs other rows instead (issue 41): relaunch and in process, the host lost
with no notice and after a 15 s decommission notice (SIGPWR to its Spark worker, then
SIGKILL): the longest time without a training step around the loss, and the steps redone
(`notice_rows`).

A size whose ranks would not fit in the memory the machine has free is left out and
named in the output. After each case the worker is started again.

    sudo .venv/bin/python benchmarks/elastic_recovery.py [--sizes 10M 100M 500M]
        [--only in-process relaunch fixed distributor horovod]

SPARKDIST_NETNS_PREFIX / SPARKDIST_NETNS_SUBNET name the cluster (two runs at once need
their own). Prints one table (markdown; the rows also in /tmp/elastic_recovery.json).
Takes 15-20 minutes; not part of `make test`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bench_table  # a sibling script, not a package
import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "cluster"))

from netns_cluster import (  # noqa: E402
    DECOMMISSION_CONF,
    HOST_RESOURCE_CONF,
    NetnsCluster,
    can_build,
)
from remote_driver import RemoteDriver  # noqa: E402

PREFIX = os.environ.get("SPARKDIST_NETNS_PREFIX", "sdb")
SUBNET = os.environ.get("SPARKDIST_NETNS_SUBNET", "10.213.27")
"""The cluster's names and addresses (as in the tests: two runs at once need their own)."""
STEP_S = 0.4
KILL_AFTER_STEP = 12
SAVE_EVERY = 10
RUNNER = {"start_timeout": 180, "timeout": 900}
ELASTIC = {**RUNNER, "min_np": 2, "max_np": 3}
MEMORY_COPIES = {"in process": 3, "relaunch": 4}
"""Copies of a rank's model state held at the peak: in process the parameters, the commit
(a commit overwrites the last one's tensors; a loss sends no tensors) and DDP's start-up
broadcast with slack (a 500M run with room for two copies took no step in 600 s); by relaunch
the parameters, the serialised checkpoint and the copy resumed from it. The driver keeps
the checkpoint once more."""


def parse_size(text: str) -> int:
    scale = {"K": 10**3, "M": 10**6, "G": 10**9}
    return int(float(text[:-1]) * scale[text[-1].upper()]) if text[-1].isalpha() else int(text)


def read_lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for(condition, job, what: str, timeout_s: float = 300):
    """Poll `condition()` until it returns something true; fail if the job ended first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        if job is not None and job.done():
            raise RuntimeError(f"the job ended before {what}: {job.result()}")
        time.sleep(0.02)
    raise TimeoutError(f"no {what} within {timeout_s}s")


def host_of_pid(cluster: NetnsCluster, pid: int) -> int:
    """Which host's worker the process `pid` runs under."""
    parents = {p.pid for p in psutil.Process(pid).parents()}
    for i in range(cluster.state.hosts):
        if cluster.state.pids[f"worker-{i}"] in parents:
            return i
    raise RuntimeError(f"process {pid} runs under no worker")


def wait_executors(remote: RemoteDriver, count: int, timeout_s: float = 120) -> None:
    """Wait until `remote` has `count` executors, each with its Python worker started."""
    deadline = time.monotonic() + timeout_s
    while len(remote.call("executor_hosts")) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{remote.name} did not get {count} executors back")
        time.sleep(0.5)
    remote.call("warm_up", tasks=count)


# --- what each kind of job leaves in its progress directory ---------------------------


class Progress:
    """A job's records: `steps.jsonl` (rank 0, one line a step) and the ranks' processes."""

    def __init__(self, path: Path):
        self.path = path

    def steps(self) -> list[dict]:
        return read_lines(self.path / "steps.jsonl")

    def world(self, row: dict) -> int:
        """Which world a step row belongs to (the attempt, or the generation in process)."""
        return row.get("generation", row.get("attempt", 0))

    def pids(self, world: int) -> dict[int, int]:
        """rank -> pid of the ranks of `world`, as far as they have recorded it."""
        return {r["rank"]: r["pid"] for r in self._ranks() if r["world"] == world}

    def _ranks(self) -> list[dict]:
        found = []
        for path in self.path.glob("rank-*.json"):  # elastic_main, TorchDistributor
            try:
                where = json.loads(path.read_text())
            except ValueError:
                continue  # being written
            found.append({"rank": where["rank"], "pid": where["pid"], "world": where["attempt"]})
        for path in self.path.glob("events-*.jsonl"):  # in process, Horovod
            for e in read_lines(path):
                if e["event"] == "enter":
                    found.append(
                        {
                            "rank": e["rank"],
                            "pid": e["pid"],
                            "world": e.get("generation", e["size"]),
                        }
                    )
        return found


class HorovodProgress(Progress):
    """Horovod's ranks say no generation: a world is told by its size (3, then 2)."""

    def world(self, row: dict) -> int:
        return row["world_size"]


def victim(cluster: NetnsCluster, progress: Progress, world: int) -> int:
    """A host that runs a rank of `world` but not rank 0 (its saves are the record)."""
    pids = progress.pids(world)
    return host_of_pid(cluster, pids[max(pids)])


def wait_full_world(progress: Progress, job) -> int:
    """The world of 3 that took KILL_AFTER_STEP steps (a job may start with fewer, and
    grow), once every rank's pid is recorded."""
    steps = wait_for(
        lambda: [
            s for s in progress.steps() if s["step"] >= KILL_AFTER_STEP and s["world_size"] == 3
        ],
        job,
        "the first steps",
        timeout_s=600,
    )
    world = progress.world(steps[-1])
    wait_for(lambda: len(progress.pids(world)) == 3, job, "every rank's pid")
    return world


def measure_after_loss(
    row: dict, progress: Progress, job, killed_at: float, old_world: int, old_pids: set[int]
) -> None:
    """Into `row`: loss -> next step of a later world, the world's size then, steps
    redone, survivors restarted; as much of it as there is if the job ended first."""

    def next_step():
        later = [
            s for s in progress.steps() if s["at"] > killed_at and progress.world(s) != old_world
        ]
        return later[0] if later else None

    try:
        step = wait_for(next_step, job, "a step after the loss", timeout_s=400)
        row["next_step_s"] = step["at"] - killed_at
        row["world_after"] = step["world_size"]
        last_old = max(s["step"] for s in progress.steps() if progress.world(s) == old_world)
        row["redone"] = last_old - (step["step"] - 1)
        new_world = progress.world(step)
        survivors = wait_for(
            lambda: (
                len(progress.pids(new_world)) >= step["world_size"] and progress.pids(new_world)
            ),
            job,
            "the new world's pids",
        )
        row["restarts"] = sum(pid not in old_pids for pid in survivors.values())
    except RuntimeError:
        pass  # the job ended (failed) without another step, or before its pids


def run_case(cluster: NetnsCluster, remote: RemoteDriver, case: Case) -> None:
    """Start the case's job, kill a host after a few steps, bring the worker back (after
    `replacement_s`, or once the job stepped again), and fill the case's row: loss -> next
    step of a later world, steps redone, survivors restarted, the job's outcome."""
    row = case.row
    directory = Path(tempfile.mkdtemp(prefix="elastic-bench-"))
    progress = case.progress_kind(directory)
    stop_file = directory / "stop"
    job = case.submit(str(directory), str(stop_file))
    old_world = wait_full_world(progress, job)
    old_pids = set(progress.pids(old_world).values())
    lost = victim(cluster, progress, old_world)
    killed_at = time.time()  # stop_worker SIGKILLs first, then waits for the master
    cluster.stop_worker(lost)
    print(
        f"  {row['case']}: killed host {lost}'s worker after step {len(progress.steps())}",
        flush=True,
    )
    timer = None
    if case.replacement_s is not None:
        timer = threading.Timer(case.replacement_s, cluster.start_worker, args=(lost,))
        timer.start()
    measure_after_loss(row, progress, job, killed_at, old_world, old_pids)
    stop_file.touch()
    result = job.result(timeout=900)
    if timer is None:
        cluster.start_worker(lost)
    else:
        timer.join()  # returns once start_worker has
    wait_executors(remote, cluster.state.hosts)
    record_outcome(row, result, killed_at)
    print(f"  {row['case']}: {row}", flush=True)


def record_outcome(row: dict, result: dict, killed_at: float) -> None:
    """The job's end in `row`; for a failed job without a later step, the time from the
    loss to its error and the error's first telling line."""
    if result["ok"]:
        row["outcome"] = f"succeeded, {result.get('attempts', 1)} attempt(s)"
        return
    row["outcome"] = f"failed: {result.get('error_type')}"
    if row.get("next_step_s") is None and result.get("failed_at"):
        row["error_s"] = result["failed_at"] - killed_at
    lines = (result.get("error") or "").strip().splitlines() or [""]
    row["error"] = next((x for x in lines if "Exception:" in x), lines[0]).strip()[:300]


def fits(kind: str, parameters: int) -> str | None:
    """None if 3 ranks of this kind and size fit in the memory free now, else why not."""
    need = 3 * MEMORY_COPIES[kind] * 4 * parameters + 4 * parameters + 2 * 2**30
    free = psutil.virtual_memory().available
    if need <= free:
        return None
    return f"needs about {need / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free"


LOSS_COLUMNS = [
    "job",
    "model state",
    "loss -> next step s",
    "steps redone",
    "survivors restarted",
    "ranks after",
    "outcome",
]


def table(rows: list[dict]) -> str:
    lines = [
        "| job | model state | loss -> next step | steps redone | survivors restarted "
        "| ranks after | outcome |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for cells in loss_cells(rows, text=True):
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def loss_cells(rows: list[dict], text: bool) -> list[list]:
    """The loss table's cells; with `text` False the time to the next step is in seconds
    (a number) where there was one, for the JSON."""
    out = []
    for row in rows:
        if row.get("skipped"):
            took = f"not run: {row['skipped']}"
        elif row.get("next_step_s") is not None:
            took = f"{row['next_step_s']:.1f} s" if text else row["next_step_s"]
        elif "error_s" in row:
            took = f"none (error after {row['error_s']:.1f} s)"
        else:
            took = "none"
        out.append(
            [
                row["case"],
                row.get("size", "-"),
                took,
                row.get("redone", "-"),
                row.get("restarts", "-"),
                row.get("world_after", "-"),
                row.get("outcome", ""),
            ]
        )
    return out


@dataclass
class Case:
    """One row of the loss table: how to start its job, and what to wait for."""

    row: dict
    submit: Callable[[str, str], Any]
    """`submit(progress_dir, stop_file)` starts the job; returns its remote handle."""
    progress_kind: type[Progress] = Progress
    replacement_s: float | None = None
    """When the lost worker comes back (None: once the job stepped again)."""
    sized: tuple[str, int] | None = None
    """(kind, parameters), for `fits`; None for the tiny peers' models."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["10M", "100M", "500M"])
    parser.add_argument(
        "--relaunch-sizes",
        nargs="+",
        default=None,
        help="sizes of the relaunch rows (default: --sizes)",
    )
    parser.add_argument("--replacement-s", type=float, default=30.0)
    parser.add_argument(
        "--notice",
        action="store_true",
        help="run the decommission-notice rows instead (no notice vs a NOTICE_S notice)",
    )
    parser.add_argument(
        "--only",
        nargs="*",
        default=None,
        help="run only these kinds: in-process relaunch fixed distributor horovod",
    )
    return parser.parse_args()


@contextmanager
def bench_cluster() -> Iterator[tuple[NetnsCluster, RemoteDriver]]:
    """The namespaced 3-host cluster and one driver application with an executor per host
    (a host's loss takes its slot away until a worker returns); Gloo on the hosts' network
    interface for the peers' processes (their host names resolve to loopback here;
    sparkdist's ranks pick the interface themselves). Both go at the end."""
    reason = can_build()
    if reason:
        raise SystemExit(f"cannot build the namespaced cluster: {reason}")
    cluster = NetnsCluster(hosts=3, prefix=PREFIX, subnet=SUBNET, worker_cores=3).up()
    conf = {
        **HOST_RESOURCE_CONF,
        **DECOMMISSION_CONF,
        "spark.executorEnv.GLOO_SOCKET_IFNAME": "tn0",
        "spark.executorEnv.HOROVOD_GLOO_IFACE": "tn0",
    }
    os.environ["PYSPARK_SUBMIT_ARGS"] = (
        " ".join(f"--conf {k}={v}" for k, v in conf.items()) + " pyspark-shell"
    )
    try:
        remote = RemoteDriver(cluster, "bench", cores=3)
        try:
            wait_executors(remote, 3)
            yield cluster, remote
        finally:
            remote.close()
    finally:
        cluster.down()


def restore_workers(cluster: NetnsCluster, remote: RemoteDriver) -> None:
    """Start every stopped worker again and wait for its executor."""
    for i in range(cluster.state.hosts):
        if not cluster.alive(f"worker-{i}"):
            cluster.start_worker(i)
    wait_executors(remote, cluster.state.hosts)


def loss_cases(args: argparse.Namespace, remote: RemoteDriver) -> list[Case]:
    """The loss table's rows that `--only` keeps, in order."""
    kinds = set(args.only or ["in-process", "relaunch", "fixed", "distributor", "horovod"])

    def sparkdist_job(main: str, runner: dict, **extra):
        def submit(progress_dir, stop_file):
            kwargs = {
                "progress_dir": progress_dir,
                "stop_file": stop_file,
                "min_steps": KILL_AFTER_STEP + 3,
                "step_s": STEP_S,
                **extra,
            }
            return remote.submit("run_job", main=main, np=3, runner=runner, kwargs=kwargs)

        return submit

    def distributor(progress_dir, stop_file):
        return remote.submit(
            "run_torch_distributor", progress_dir=progress_dir, steps=150, step_s=STEP_S
        )

    def horovod(progress_dir, stop_file):
        return remote.submit(
            "run_horovod_elastic",
            progress_dir=progress_dir,
            steps=KILL_AFTER_STEP + 25,
            step_s=STEP_S,
        )

    cases = []
    elastic_case = "sparkdist {} (`min_np=2, max_np=3`)"
    if "in-process" in kinds:
        for size in args.sizes:
            parameters = parse_size(size)
            submit = sparkdist_job(
                "in_process_elastic_main", ELASTIC, parameters=parameters, init_sync=False
            )
            row = {"case": elastic_case.format("in process"), "size": size}
            cases.append(Case(row, submit, sized=("in process", parameters)))
    if "relaunch" in kinds:
        for size in args.relaunch_sizes or args.sizes:
            parameters = parse_size(size)
            submit = sparkdist_job(
                "elastic_main", ELASTIC, parameters=parameters, save_every=SAVE_EVERY
            )
            case = elastic_case.format("relaunch") + f", a checkpoint every {SAVE_EVERY} steps"
            cases.append(Case({"case": case, "size": size}, submit, sized=("relaunch", parameters)))
    if "fixed" in kinds:
        case = (
            f"sparkdist fixed `np=3, max_failures=1`, replacement worker after "
            f"{args.replacement_s:.0f} s"
        )
        submit = sparkdist_job("elastic_main", {**RUNNER, "max_failures": 1})
        cases.append(
            Case({"case": case, "size": "9 (tiny)"}, submit, replacement_s=args.replacement_s)
        )
    if "distributor" in kinds:
        row = {"case": "pyspark `TorchDistributor(num_processes=3)`", "size": "9 (tiny)"}
        cases.append(Case(row, distributor))
    if "horovod" in kinds:
        row = {"case": "`horovod.spark.run_elastic` (Gloo, min 2, max 3)", "size": "9 (tiny)"}
        cases.append(Case(row, horovod, progress_kind=HorovodProgress))
    return cases


def run_cases(cluster: NetnsCluster, remote: RemoteDriver, cases: list[Case]) -> list[dict]:
    """Each case's row: measured, or why it was not (too large for the memory free, or
    the benchmark could not measure it; the cluster is whole again after it)."""
    rows = []
    for case in cases:
        row = case.row
        why_not = fits(*case.sized) if case.sized else None
        if why_not:
            row["skipped"] = why_not
            print(f"  {row['case']} {row['size']}: not run: {why_not}", flush=True)
        else:
            try:
                run_case(cluster, remote, case)
            except (RuntimeError, TimeoutError) as exc:
                row["outcome"] = f"benchmark could not measure it: {exc}"[:400]
                print(f"  {row['case']}: {row['outcome']}", flush=True)
                restore_workers(cluster, remote)
        rows.append(row)
    return rows


def main() -> None:
    args = parse_args()
    with bench_cluster() as (cluster, remote):
        if args.notice:
            rows = notice_rows(cluster, remote)
            title = notice_table(rows).splitlines()[0]
            cells = notice_cells(rows, text=False)
            columns = NOTICE_COLUMNS
            bench_table.print_table("notice", title, columns, cells, text=notice_table(rows))
            return
        rows = run_cases(cluster, remote, loss_cases(args, remote))
    print()
    title = (
        f"Loss of one of 3 hosts (Spark worker and its executors SIGKILLed) during a 3-rank "
        f"DDP job, a step every {STEP_S} s, after step {KILL_AFTER_STEP}; standalone "
        f"cluster in network namespaces"
    )
    print(title)
    cells = loss_cells(rows, text=False)
    bench_table.print_table("loss", title, LOSS_COLUMNS, cells, text=table(rows))
    for row in rows:
        if row.get("error"):
            print(f"  {row['case']}: {row['error']}")
    Path("/tmp/elastic_recovery.json").write_text(json.dumps(rows, indent=1))


# --- decommission notices (issue 41): the same host lost with and without a notice -------

NOTICE_S = 15.0
"""The notice a host gets before it is lost (SIGPWR to its worker, then SIGKILL)."""


def notice_rows(cluster: NetnsCluster, remote: RemoteDriver) -> list[dict]:
    """For relaunch and in process: the host lost with no notice, and after a NOTICE_S
    notice. Each row: the longest time without a training step around the loss (from a
    few seconds before the notice, or the kill, until the smaller world has stepped a
    while), and the steps redone (step numbers recorded twice)."""
    jobs = {
        "relaunch": ("elastic_main", {"save_every": SAVE_EVERY}),
        "in process": ("in_process_elastic_main", {}),
    }
    rows = []
    for label, (main, extra) in jobs.items():
        for notice_s in (None, NOTICE_S):
            row = {
                "job": f"sparkdist {label}",
                "notice": "none" if notice_s is None else f"{notice_s:.0f} s",
            }
            kwargs = {"min_steps": KILL_AFTER_STEP + 3, "step_s": STEP_S, **extra}
            try:
                rows.append(notice_case(cluster, remote, row, main, kwargs, notice_s))
            except (RuntimeError, TimeoutError) as exc:
                row["outcome"] = f"benchmark could not measure it: {exc}"[:300]
                rows.append(row)
            restore_workers(cluster, remote)
            print(f"  {row}", flush=True)
    return rows


def notice_case(cluster, remote, row: dict, main: str, kwargs: dict, notice_s) -> dict:
    directory = Path(tempfile.mkdtemp(prefix="elastic-notice-"))
    progress = Progress(directory)
    stop_file = directory / "stop"
    job = remote.submit(
        "run_job",
        main=main,
        np=3,
        runner=ELASTIC,
        kwargs={"progress_dir": str(directory), "stop_file": str(stop_file), **kwargs},
    )
    lost = victim(cluster, progress, wait_full_world(progress, job))
    start = time.time()
    if notice_s is not None:
        cluster.decommission_worker(lost)
        time.sleep(notice_s)
    killed = time.time()
    cluster.stop_worker(lost)
    wait_for(
        lambda: (
            len([s for s in progress.steps() if s["at"] > killed and s["world_size"] == 2]) >= 10
        ),
        job,
        "10 steps after the loss",
        timeout_s=400,
    )
    stop_file.touch()
    result = job.result(timeout=600)
    rows = progress.steps()
    times = sorted(s["at"] for s in rows if start - 5 <= s["at"])
    row["gap_s"] = max(b - a for a, b in zip(times, times[1:], strict=False))
    row["redone"] = len(rows) - len({s["step"] for s in rows})
    # The job may start with 2 ranks and grow: the smaller world is the one after `start`.
    first_small = min(s["at"] for s in rows if s["world_size"] == 2 and s["at"] >= start)
    row["smaller_world_s"] = first_small - killed  # < 0: stepping before the kill
    row["outcome"] = (
        f"succeeded, {result.get('attempts', 1)} attempt(s)"
        if result["ok"]
        else f"failed: {result.get('error_type')}"
    )
    return row


NOTICE_COLUMNS = [
    "job",
    "notice",
    "longest time without a step s",
    "steps redone",
    "smaller world's first step, from the kill s",
    "outcome",
]


def notice_table(rows: list[dict]) -> str:
    lines = [
        f"Loss of one of 3 hosts during a 3-rank DDP job (a step every {STEP_S} s; relaunch: a "
        f"checkpoint every {SAVE_EVERY} steps), with no notice and with a {NOTICE_S:.0f} s "
        "decommission notice (SIGPWR to the host's Spark worker, then SIGKILL)",
        "",
        "| job | notice | longest time without a step | steps redone "
        "| smaller world's first step, from the kill | outcome |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for cells in notice_cells(rows, text=True):
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def notice_cells(rows: list[dict], text: bool) -> list[list]:
    """The notice table's cells; with `text` False the times are numbers, for the JSON."""
    out = []
    for row in rows:
        gap, smaller = row.get("gap_s"), row.get("smaller_world_s")
        if text:
            gap = f"{gap:.1f} s" if gap is not None else "-"
            smaller = f"{smaller:+.1f} s" if smaller is not None else "-"
        cells = [row["job"], row["notice"], gap, row.get("redone", "-"), smaller]
        out.append([*cells, row.get("outcome", "")])
    return out


if __name__ == "__main__":
    main()
