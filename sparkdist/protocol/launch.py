"""What every launch shares: the job's launch spec, the `Launch` interface that each
launch kind's world implements (`runner/driver/launch/`: driver-local, barrier, relayed,
gang), the environment of what a task starts, the command lines of mpirun and of a rank's
supervisor, and starting a launcher process with its output relayed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sparkdist.job_environment import DirectRank, JobEnvironment, TaskEnvironment
from sparkdist.protocol.processes import ProcessRecord, popen_group

SUPERVISOR_MODULE = "sparkdist.runner.rank.supervisor"


@dataclass(frozen=True)
class LaunchSpec:
    """Everything a task needs to start its part of a job (sent in the task closure)."""

    job: JobEnvironment
    num_ranks: int
    env: Mapping[str, str]
    mpi_args: Sequence[str]
    network_interface: str | None
    driver_path: str
    driver_pythonpath: str
    relay: Any = None
    """A `relayed.RelayPlan` when the job's service runs in barrier task 0 (a Spark Connect
    client the executors cannot reach), else None."""
    ranks_per_task: int = 1
    """Ranks each barrier task starts (one per GPU of the task, as torchrun's
    nproc_per_node); consecutive ranks share a task."""

    @property
    def num_tasks(self) -> int:
        """How many barrier tasks the job's stage has."""
        return self.num_ranks // self.ranks_per_task


class Launch(Protocol):
    """How a job's processes are started and stopped: on the driver or by Spark."""

    def start(self) -> None:
        """Start the job's processes (returns once they are on their way)."""

    def wait(self, start_deadline: float, deadline: float | None, launcher_expected: bool) -> None:
        """Until the job succeeded (return) or failed or ran out of time (raise)."""

    def stop(self, finished: bool) -> list[ProcessRecord]:
        """Stop everything the job started; return what could not be stopped. After a job
        that `finished`, its processes get a moment to exit by themselves."""


class LauncherSink(Protocol):
    """Where a launcher process's record, output and exit are reported: the job's
    state on the driver, or a task's channel to it."""

    def record(self, record: ProcessRecord) -> None: ...

    def launcher_output(self, lines: list[str]) -> None: ...

    def launcher_exited(self, name: str, exit_code: int) -> None: ...


def mpirun_available() -> bool:
    return shutil.which("mpirun") is not None


def _merge_paths(first: str, then: str) -> str:
    entries: list[str] = []
    for entry in (first.split(os.pathsep) if first else []) + (
        then.split(os.pathsep) if then else []
    ):
        if entry and entry not in entries:
            entries.append(entry)
    return os.pathsep.join(entries)


def job_env(
    spec: LaunchSpec,
    base: Mapping[str, str],
    *,
    task_host: str,
    node_rank: int,
    num_nodes: int,
) -> dict[str, str]:
    """The environment of everything a task starts for the job (and so of its ranks).

    The executor's own environment, the driver's PATH and PYTHONPATH in front of the
    executor's, the user's extra variables, and sparkdist's own. The secret travels
    here, never on a command line.
    """
    env = dict(base)
    env["PATH"] = _merge_paths(spec.driver_path, base.get("PATH", ""))
    pythonpath = _merge_paths(spec.driver_pythonpath, base.get("PYTHONPATH", ""))
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    env.update(spec.env)
    task = TaskEnvironment(spec.job, task_host=task_host, node_rank=node_rank, num_nodes=num_nodes)
    env.update(task.to_env())
    if os.geteuid() == 0:
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    return env


def direct_rank_env(env: Mapping[str, str], place: DirectRank) -> dict[str, str]:
    """The environment of one rank's supervisor under the direct launcher."""
    return {**env, **place.to_env()}


def supervisor_argv(python: str) -> list[str]:
    return [python, "-m", SUPERVISOR_MODULE]


def _mca(*parameters: tuple[str, str]) -> list[str]:
    """Open MPI parameters as mpirun takes them: `--mca NAME VALUE` for each."""
    return [arg for name, value in parameters for arg in ("--mca", name, value)]


def mpirun_argv(
    python: str,
    np: int,
    hosts: Sequence[tuple[str, int]],
    networks: Sequence[str],
    extra_args: Sequence[str],
    rsh_agent: str | None = None,
    btl: Sequence[str] = ("self", "tcp"),
) -> list[str]:
    """mpirun's command line: one `-H` entry per task, the rsh agent (the command mpirun
    runs in ssh's place, e.g. sparkdist's `runner/task/rsh.py`; None on one host), the
    networks every task can use, no core binding (Spark manages the cores). `btl`:
    Open MPI's transports (TCP between tasks; see `shared_memory_btl` for ranks that
    share one host)."""
    nets = ",".join(dict.fromkeys(networks))
    argv = [
        "mpirun",
        "-np",
        str(np),
        "-H",
        ",".join(f"{name}:{slots}" for name, slots in hosts),
        "--bind-to",
        "none",
        "--map-by",
        "slot",
        "--stdin",
        "none",
    ]
    argv += _mca(
        ("pml", "ob1"),
        ("btl", ",".join(btl)),
        ("oob_tcp_if_include", nets),
        ("btl_tcp_if_include", nets),
        # orted maps a shared copy of the hwloc topology into a "hole" it finds in its
        # address space; Open MPI 4.1's orted can crash there (SIGSEGV in
        # hwloc_shmem_topology_write, seen in CI). Ranks read the topology themselves.
        ("rtc_hwloc_vmhole", "none"),
    )
    if rsh_agent is not None:
        argv += _mca(
            ("plm_rsh_agent", rsh_agent),
            ("plm_rsh_no_tree_spawn", "1"),
            # Keep each orted in the foreground of its task (no --daemonize), so it
            # stays a child of the task, in the task's process group.
            ("orte_leave_session_attached", "1"),
            ("routed", "direct"),
            # The hosts are task names, not DNS names: without this, mpirun looks every
            # one up (getaddrinfo) before it starts any daemon, and a resolver that drops
            # part of a burst of queries costs a 5 s timeout each (15 s at np=32 here).
            ("if_base_do_not_resolve", "1"),
        )
    return argv + list(extra_args) + supervisor_argv(python)


def shared_memory_btl() -> tuple[list[str], list[str]]:
    """Transports for ranks that all run on one host (np < 0): shared memory (vader)
    first, as plain mpirun uses on one host; TCP over loopback is 2-4x slower for large
    messages. Returns (btl list, extra mpirun args).

    vader's single-copy mode (CMA) reads a sibling rank's memory, which Yama's
    ptrace_scope >= 1 forbids; there it copies through shared memory instead.
    """
    extra: list[str] = []
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            restricted = int(f.read().strip() or 0) >= 1
    except (OSError, ValueError):
        restricted = False
    if restricted:
        extra = ["--mca", "btl_vader_single_copy_mechanism", "none"]
    return ["self", "vader", "tcp"], extra


def start_launcher(
    argv: list[str], env: Mapping[str, str], name: str, role: str, host: str, sink: LauncherSink
) -> subprocess.Popen:
    """Start a launcher (mpirun, or a rank's supervisor) in a process group of its own;
    report it, its merged output and its exit (as `name`) to `sink`."""
    proc = popen_group(
        argv, env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    sink.record(ProcessRecord.of(proc.pid, role, host))

    def relay() -> None:
        for raw in iter(proc.stdout.readline, b""):
            sink.launcher_output([raw.decode("utf-8", errors="replace").rstrip("\n")])
        sink.launcher_exited(name, proc.wait())

    threading.Thread(target=relay, name="sparkdist-launcher-output", daemon=True).start()
    return proc
