"""The chaos soak (issue 64): an elastic DDP job on the 3-host namespaced cluster
(tests/cluster) under a seeded schedule of faults, against a fault-free control of the
same seed; a table per fault kind, the goodput, and every invariant's result.

    python benchmarks/soak.py --minutes 10 --seed 7                 # as root
    python benchmarks/soak.py --minutes 10 --seed 7 --mode relaunch
    python benchmarks/soak.py --minutes 3 --time-scale 0.25 --every-kind --seed 64
    python benchmarks/soak.py --replay schedule.jsonl --minutes 30

It builds the cluster itself and tears it down. The job (tests/cluster/soak_job.py) trains
to a target step at a fixed global batch over generated rows: in process
(`sparkdist.elastic.run`, `--mode inprocess`) or relaunched from its last checkpoint
(`checkpoint.save(..., every=K)` into the driver's store, `--mode relaunch`); the injector
(soak_faults.py) does each fault to the live ranks and hosts when its time comes, once
the world is whole again (a fault on a world at `min_np` would end it: with 3 hosts, one
fault at a time, except the schedule's followers). `--time-scale` scales the issue's
durations (30-120 s stops, 20-90 s cuts, ...), a notice's 15 s lead (not below 5 s) and
the mean gap between faults. The last line printed is one JSON object: goodput, faults by
kind, each invariant's result.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests" / "cluster"), str(HERE.parent / "tests")]

import psutil  # noqa: E402
import soak_checks as checks  # noqa: E402
import soak_schedule as schedule  # noqa: E402
from soak_faults import DriverStore, Fired, Injector, Store, World, read_lines  # noqa: E402

logger = logging.getLogger("soak")

HOSTS = 3
ELASTIC_TIMEOUT_S = 8.0
"""The ranks' collective timeout (SPARKDIST_ELASTIC_TIMEOUT_S): a cut host's peers give up
on it after this (tests/cluster/test_elastic_cluster.py's figure)."""


@dataclass
class SoakOptions:
    minutes: float = 0.0
    """How long the faults go on; then the job is told to stop (`finish`)."""
    target_step: int = 100_000
    """Where the control stops (the soak's own stop, for the control of a soak)."""
    stall_timeout_s: float = 30.0
    """Given, it also fails a job in which no rank can be singled out: at the start, on a
    loaded machine, every rank can be importing torch for more than 10 s."""
    step_s: float = 0.3
    control_step_s: float | None = None
    """The control's step sleep (None: `step_s`). A shorter one makes the control quicker
    and changes no row or weight it computes; its step in the report is then its median
    step plus the sleep it left out (the short soak of the tests: 100 s less)."""
    time_scale: float = 1.0
    rows: int = 480
    global_batch: int = 48  # 10 steps an epoch at any world size; 24 or 16 rows a rank
    save_every: int = 5
    max_np: int = HOSTS
    """One rank a slot. A rank lost while its executor lives frees its slot: the driver
    ends its task and submits one in its place, which the world grows into."""
    settle_steps: int = 3
    """Steps of the whole world between one fault and the next (followers excepted)."""
    mode: str = "inprocess"
    """"relaunch": the job on the relaunch path (`soak_job.soak_relaunch_main`, the
    driver's checkpoint store, `max_np` 3: each launch asks for the slots there are)."""

    @property
    def relaunch(self) -> bool:
        return self.mode == "relaunch"

    def duration_s(self, fault: schedule.Fault) -> float:
        """The fault's duration at this time scale; a stopped or stuck rank outlasts
        stall_timeout, so that the stall watch is what ends it."""
        scaled = fault.duration_s * self.time_scale
        if fault.kind in ("sigstop", "stuck"):
            # The rank is dropped about stall_timeout + the stacks' wait after it stops:
            # a SIGCONT before that races the stall watch.
            scaled = max(scaled, self.stall_timeout_s + 20.0)
        if fault.kind == "cut_host":
            # Not below the 20 s (a shorter cut re-forms the same world:
            # tests/cluster/test_elastic_cluster.py tests that one).
            scaled = max(scaled, 20.0)
        return scaled

    @property
    def gate_s(self) -> float:
        """How long a fault waits for the world to be whole before it is given up."""
        return 120.0 * self.time_scale + 180.0


class Peaks(threading.Thread):
    """Peak resident memory (MiB) of the driver's processes and of each host's
    executors (with their Python workers and ranks), sampled every second."""

    def __init__(self, cluster, driver_pid: int, app_id: str):
        super().__init__(daemon=True)
        self.cluster, self.driver_pid, self.app_id = cluster, driver_pid, app_id
        self.peaks: dict[str, float] = {}
        self.parts: dict[str, str] = {}
        """What each peak was made of: the processes' count and the largest (MiB)."""
        self.stopping = threading.Event()

    def _rss(self, procs: list) -> float:
        total = 0
        for proc in procs:
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                pass
        return total / 2**20

    def _executors(self, host: int) -> list:
        """The soak application's executors on `host` and all under them (other
        applications' executors, such as the tests' main driver's, are not counted)."""
        found = []
        try:
            executors = self.cluster.executors(host)
        except psutil.Error:  # the host's worker is lost
            return []
        for executor in executors:
            try:
                if self.app_id in " ".join(executor.cmdline()):
                    found += [executor, *executor.children(recursive=True)]
            except psutil.Error:
                pass
        return found

    def run(self) -> None:
        while not self.stopping.wait(1.0):
            driver = psutil.Process(self.driver_pid)
            now = {"driver": [driver, *driver.children(recursive=True)]}
            for i in range(HOSTS):
                now[f"host {i}"] = self._executors(i)
            for who, procs in now.items():
                rss = self._rss(procs)
                if rss > self.peaks.get(who, 0.0):
                    self.peaks[who] = rss
                    each = sorted((self._rss([p]) for p in procs), reverse=True)
                    self.parts[who] = f"{len(each)} processes, " + "+".join(
                        f"{v:.0f}" for v in each[:4]
                    )


ON_RANKS = {"sigkill", "sigstop", "stuck", "exit", "slow_rank"}
CHANGES_WORLD = {"sigkill", "sigstop", "stuck", "cut_host", "lose_host", "notice", "exit"}
CHANGES_WORLD |= {"in_checkpoint", "grow"}


def whole(injector: Injector, since_step: int, settle: int, before: Fired | None = None) -> bool:
    """Every host up and in the world, `settle` steps after `since_step` and as many of
    the world's own (a relaunched world resumes before `since_step`), and (after a fault
    that changes the world) in a world formed since the fault `before`."""
    last, made = injector.world.last_step(), injector.world.steps_of_generation()
    if before is not None and before.fault.kind in CHANGES_WORLD and not before.skipped:
        if last["generation"] <= before.generation:
            return False
    return (
        len(injector.hosts_up()) == HOSTS
        and last["world_size"] == HOSTS
        and len(injector.world.members()) == HOSTS
        and last["step"] >= since_step + settle
        and made >= settle
    )


def wait_for_turn(injector: Injector, job, fault, at: float, before: Fired | None, opts) -> str:
    """Wait until `fault` may be done: its time has come and (unless it follows the one
    before, or is a grow) the world is whole; lost hosts come back first. Returns why not
    ('' when it may)."""
    if fault.kind != "grow" and not fault.follows:
        for host in sorted(injector.down):
            injector.bring_back(host)
    # The world has gate_s to be whole once the fault is due, not from now: a fault due
    # more than gate_s after the last one was skipped though the world was whole.
    deadline = time.monotonic() + max(0.0, at - time.time()) + opts.gate_s
    while not job.done():
        since = before.step if before is not None else 0
        # A follower waits for a rank to hit (none while a job relaunches).
        ranks = fault.kind not in ON_RANKS or bool(injector.world.members())
        ready = (
            (fault.follows and ranks)
            or fault.kind == "grow"
            or whole(injector, since, opts.settle_steps, before)
        )
        if ready and time.time() >= at:
            return ""
        if time.monotonic() > deadline:
            return f"the world was not whole within {opts.gate_s:.0f} s"
        time.sleep(0.1)
    return "the job had ended"


def inject(injector: Injector, job, faults: list, opts: SoakOptions, start: float) -> list[Fired]:
    """Do the schedule's faults to the running job, in order."""
    fired: list[Fired] = []
    previous = None
    for fault in faults:
        if fault.follows and fired and previous is not None:
            at = fired[-1].at + max(0.0, fault.at_s - previous.at_s)
        else:
            at = start + fault.at_s
        why = wait_for_turn(injector, job, fault, at, fired[-1] if fired else None, opts)
        if why == "the job had ended":
            break
        if why:
            last = injector.world.last_step()
            fired.append(Fired(fault, time.time(), "", last["step"], last["generation"], why))
        else:
            fired.append(injector.fire(fault, opts.duration_s(fault)))
        previous = fault
    return fired


def leftovers(
    cluster, result: dict, log: str, driver_pid: int, ports_before: set[int], killed_tasks: int
) -> list[str]:
    """What the job left: rank or supervisor processes, listening ports of the driver's
    processes that were not there before it, and the /tmp/sparkdist-<id>-task* folders of
    its attempts (each relaunch is a job id of its own, named in the driver's `log`)
    beyond the `killed_tasks` whose process was SIGKILLed (by the soak, or with a lost
    host): a killed task cannot remove its own."""
    from checks import records, wait_all_gone, wait_no_job_processes

    left = [f"process {r.pid} ({r.role})" for r in wait_all_gone(records(result), 60)]
    left += wait_no_job_processes(cluster, 60)
    ids = set(re.findall(r"sparkdist job ([0-9a-f]{12})\b", log)) | {result.get("job_id")}
    files = [f for i in ids - {None} for f in Path(tempfile.gettempdir()).glob(f"sparkdist-{i}*")]
    if len(files) > killed_tasks:
        left += [
            f"{len(files)} /tmp/sparkdist-<job>* of {len(ids)} attempts ({killed_tasks} killed)"
        ]
    left += [f"listening port {port}" for port in listening(driver_pid) - ports_before]
    return left


def listening(pid: int) -> set[int]:
    """The TCP ports the process `pid` and its children listen on."""
    root = psutil.Process(pid)
    ports = set()
    for proc in [root, *root.children(recursive=True)]:
        try:
            conns = proc.net_connections("tcp")
        except psutil.Error:
            continue
        ports |= {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}
    return ports


def run_once(cluster, remote, workdir: Path, faults: list, opts: SoakOptions, stop: bool) -> dict:
    """One run of the job with the faults done to it (`stop`: then told to stop, else it
    runs to opts.target_step, as the control does); returns its records."""
    from test_elastic_cluster import wait_executors

    progress, control = workdir / "progress", workdir / "control"
    for folder in (progress, control):
        folder.mkdir(parents=True)
    store = DriverStore(workdir / "store") if opts.relaunch else Store(workdir / "store", cluster)
    injector = Injector(cluster, progress, control, store, opts.time_scale)
    wait_executors(remote, HOSTS)
    ports = listening(remote.pid)
    offset = remote.log_path.stat().st_size
    peaks = Peaks(cluster, remote.pid, remote.call("app_id"))
    peaks.start()
    start = time.time()
    job = remote.submit("run_job", main=MAINS[opts.mode], np=HOSTS, **job_arguments(workdir, opts))
    try:
        fired = inject(injector, job, faults, opts, start)
        if stop:
            finish(injector, job, opts, start)
        result = job.result(timeout=3600)
    finally:
        injector.heal()
        peaks.stopping.set()
        store.close()
    healed = time.time()
    wait_executors(remote, HOSTS, timeout_s=60)  # every slot free again within 60 s
    slots_s = time.time() - healed
    with open(remote.log_path, "rb") as log:
        log.seek(offset)
        text = log.read().decode(errors="replace")
    return {
        "result": result,
        "steps": World(progress).steps(),
        "saved": read_lines(progress / "saved.jsonl"),
        "fired": fired,
        "log": text,
        "peaks": peaks.peaks,
        "parts": peaks.parts,
        "left": leftovers(cluster, result, text, remote.pid, ports, injector.killed_tasks()),
        "slots_s": slots_s,
        "step_s": opts.step_s,
    }


def finish(injector: Injector, job, opts: SoakOptions, start: float) -> None:
    """Once the soak's time is up: undo what is still in force, wait for the whole world,
    and tell the job to stop a few steps later."""
    while time.time() < start + opts.minutes * 60 and not job.done():
        time.sleep(0.5)
    injector.heal()
    deadline = time.monotonic() + opts.gate_s
    since = injector.world.last_step()["step"]
    while not job.done() and not whole(injector, since, 1) and time.monotonic() < deadline:
        time.sleep(0.2)
    injector.stop_at(injector.world.last_step()["step"] + 5)


MAINS = {"inprocess": "soak_job.soak_main", "relaunch": "soak_job.soak_relaunch_main"}


def job_arguments(workdir: Path, opts: SoakOptions) -> dict:
    runner = {"min_np": 2, "max_np": opts.max_np, "start_timeout": 120, "timeout": 3600}
    runner["stall_timeout"] = opts.stall_timeout_s
    if opts.relaunch:  # no limit on relaunches (max_failures): min_np bounds them
        runner["checkpoint_dir"] = str(workdir / "store")
    kwargs = {
        "progress_dir": str(workdir / "progress"),
        "control_dir": str(workdir / "control"),
        "checkpoint_dir": str(workdir / "store"),
        "target_step": opts.target_step,
        "row_count": opts.rows,
        "global_batch": opts.global_batch,
        "step_s": opts.step_s,
        "save_every": opts.save_every,
        "elastic_timeout_s": ELASTIC_TIMEOUT_S,
    }
    frames = {"train": {"rows": opts.rows, "path": str(workdir / "ids")}}
    return {"runner": runner, "kwargs": kwargs, "id_frames": frames}


def soak(cluster, remote, faults: list, opts: SoakOptions, workdir: Path) -> dict:
    """The soak, then its fault-free control to the same step; the report."""
    soaked = run_once(cluster, remote, workdir / "soak", faults, opts, stop=True)
    kept, _ = checks.committed(soaked["steps"])
    target = kept[-1]["step"] if kept else 1  # where the soak stopped (or failed)
    control_opts = SoakOptions(**{**asdict(opts), "target_step": target, "minutes": 0.0})
    control_opts.step_s = opts.step_s if opts.control_step_s is None else opts.control_step_s
    control = run_once(cluster, remote, workdir / "control", [], control_opts, stop=False)
    return report(soaked, control, target, opts)


def report(soaked: dict, control: dict, target: int, opts: SoakOptions) -> dict:
    """Invariants, table and goodput of a soak against its control."""
    steps, fired, result = soaked["steps"], soaked["fired"], soaked["result"]
    step_s = checks.median_step_s(control["steps"]) + opts.step_s - control["step_s"]
    left = soaked["left"] + control["left"]
    slots = max(soaked["slots_s"], control["slots_s"])
    # Redone: a step a fault in process, a checkpoint interval a relaunch; a relaunch
    # job's peers wait in their collective (no elastic timeout) until the stall watch.
    per_fault = opts.save_every if opts.relaunch else 1
    invariants = {
        "target reached": checks.check_target(result, target),
        "commits": checks.check_steps(
            steps, target, fired, per_fault=per_fault, saved=soaked["saved"]
        ),
        "rows once an epoch": checks.check_rows(steps, opts.rows, opts.global_batch),
        "the control's rows": checks.check_same_rows(steps, control["steps"]),
        "final weights and loss": checks.check_final(result, control["result"]),
        "silent ranks dropped": checks.check_silent(
            fired, soaked["log"], opts.stall_timeout_s, opts.step_s
        ),
        "nothing left": (not left and slots <= 60, f"left: {left}; slots free in {slots:.0f} s"),
        "peak memory": checks.check_memory(soaked["peaks"], control["peaks"]),
    }
    if not invariants["peak memory"][0]:
        why = invariants["peak memory"][1] + f"; soak {soaked['parts']}, control {control['parts']}"
        invariants["peak memory"] = (False, why)
    if opts.relaunch:
        invariants["checkpoints"] = checks.check_saved(soaked["saved"], target)
    kept, _ = checks.committed(steps)
    wall = kept[-1]["at"] - kept[0]["at"] if len(kept) > 1 else float("nan")
    text, kinds = checks.table(fired, steps, bool(result.get("ok")), step_s)
    return {
        "mode": opts.mode,
        "goodput": (len(kept) - 1) * step_s / wall,
        "control_step_s": step_s,
        "wall_s": wall,
        "steps": target,
        "faults": {kind: row["injected"] for kind, row in kinds.items()},
        "kinds": kinds,
        "time_lost": checks.time_lost(kinds, steps, step_s),
        "fired": [asdict(f) for f in fired],  # each fault as done, for report.json
        "table": text,
        "invariants": {name: {"ok": ok, "why": why} for name, (ok, why) in invariants.items()},
    }


def summary(out: dict) -> str:
    """The table, the goodput and the invariants as text."""
    lines = [out["table"], ""]
    lines.append(
        f"goodput {out['goodput']:.1%}: {out['steps']} steps x {out['control_step_s']:.3f} s "
        f"(the control's median step) over {out['wall_s']:.0f} s of training"
    )
    lost = ", ".join(f"{name} {s:.0f} s" for name, s in out["time_lost"].items())
    lines.append(f"time that trained nothing: {lost}")
    for name, check in out["invariants"].items():
        lines.append(f"  {'ok  ' if check['ok'] else 'FAIL'} {name}: {check['why']}")
    return "\n".join(lines)


def last_line(out: dict, seed: int) -> str:
    """The JSON line printed last: goodput, faults by kind, each invariant's result."""
    invariants = {name: check["ok"] for name, check in out["invariants"].items()}
    line = {"seed": seed, "mode": out["mode"], "goodput": round(out["goodput"], 4)}
    line["faults"] = out["faults"]
    return json.dumps({**line, "invariants": invariants})


def schedule_of(args) -> list:
    if args.replay:
        return schedule.read(args.replay)
    if args.every_kind:
        return schedule.every_kind(args.seed, gap_s=5.0, only=tuple(args.kinds))
    return schedule.draw(args.seed, args.minutes, schedule.MEAN_GAP_S * args.time_scale)


def driver_conf() -> dict[str, str]:
    """The soak's application: one executor (one slot) on each host, decommission notices
    taken."""
    from netns_cluster import DECOMMISSION_CONF, HOST_RESOURCE_CONF

    return {**HOST_RESOURCE_CONF, **DECOMMISSION_CONF}


def run_on_new_cluster(faults: list, opts: SoakOptions, prefix: str, subnet: str) -> dict:
    """Build the cluster, soak, tear it down; no namespace of it may be left."""
    import subprocess

    from helpers import TEST_JVM_OPTIONS
    from netns_cluster import NetnsCluster
    from remote_driver import RemoteDriver
    from test_elastic_cluster import submit_conf

    options = {"worker_cores": 2, "daemon_java_options": TEST_JVM_OPTIONS}
    cluster = NetnsCluster(hosts=HOSTS, prefix=prefix, subnet=subnet, **options).up()
    workdir = Path(tempfile.mkdtemp(prefix="soak-"))
    try:
        with submit_conf(driver_conf()):
            remote = RemoteDriver(cluster, "soak", cores=HOSTS)
        try:
            out = soak(cluster, remote, faults, opts, workdir)
        finally:
            remote.close()
    finally:
        cluster.down()
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left = [line.split()[0] for line in names.splitlines() if line.startswith(f"{prefix}-")]
    if left:
        out["invariants"]["nothing left"] = {"ok": False, "why": f"namespaces left: {left}"}
    out["workdir"] = str(workdir)
    return out


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mode", choices=["inprocess", "relaunch"], default="inprocess")
    parser.add_argument("--replay", type=Path, help="a schedule written by --out")
    parser.add_argument("--out", type=Path, help="write the schedule here (JSON lines)")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--every-kind", action="store_true", help="each kind once, 5 s apart")
    parser.add_argument(
        "--kinds",
        type=lambda text: text.split(","),
        default=[],
        help="with --every-kind: only these",
    )
    parser.add_argument("--stall-timeout", type=float, default=30.0)
    parser.add_argument("--prefix", default="sdsoak")
    parser.add_argument("--subnet", default="10.213.64")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _interrupt)  # a stopped soak still tears its cluster down
    faults = schedule_of(args)
    if args.out:
        schedule.write(faults, args.out)
    print(f"soak schedule (seed {args.seed}, time scale {args.time_scale:g}):")
    print(schedule.describe(faults), flush=True)
    minutes = 0.0 if args.every_kind else args.minutes
    opts = SoakOptions(minutes=minutes, time_scale=args.time_scale, mode=args.mode)
    opts.stall_timeout_s = args.stall_timeout
    out = run_on_new_cluster(faults, opts, args.prefix, args.subnet)
    print(summary(out))
    (Path(out["workdir"]) / "report.json").write_text(json.dumps(out, indent=1, default=str))
    print(f"records in {out['workdir']} (the report: report.json)")
    print(last_line(out, args.seed))
    return 0 if all(check["ok"] for check in out["invariants"].values()) else 1


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("the soak builds network namespaces: run it as root")
    raise SystemExit(main())
