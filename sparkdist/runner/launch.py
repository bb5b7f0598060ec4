"""What every launcher shares: the job's launch spec, the ranks' environment, and
the command lines of mpirun and of a rank's supervisor.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SUPERVISOR_MODULE = "sparkdist.runner.supervisor"
RSH_MODULE = "sparkdist.runner.rsh"


@dataclass(frozen=True)
class LaunchSpec:
    """Everything a task needs to start its part of a job (sent in the task closure)."""

    job_id: str
    driver: str
    secret: bytes = field(repr=False)
    np: int
    launcher: str
    log_mode: str
    env: Mapping[str, str]
    mpi_args: Sequence[str]
    network_interface: str | None
    driver_path: str
    driver_pythonpath: str
    relay: Any = None
    """A `relay.RelayPlan` when the job's service runs in barrier task 0 (a Spark Connect
    client the executors cannot reach), else None."""


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
    env.update(
        {
            "SPARKDIST_JOB_ID": spec.job_id,
            "SPARKDIST_DRIVER": spec.driver,
            "SPARKDIST_SECRET": spec.secret.hex(),
            "SPARKDIST_TASK_HOST": task_host,
            "SPARKDIST_NODE_RANK": str(node_rank),
            "SPARKDIST_NUM_NODES": str(num_nodes),
            "SPARKDIST_LOG_MODE": spec.log_mode,
            "SPARKDIST_LAUNCHER": spec.launcher,
        }
    )
    if os.geteuid() == 0:
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    return env


def direct_rank_env(
    env: Mapping[str, str], rank: int, world_size: int, local_rank: int, local_size: int
) -> dict[str, str]:
    """The environment of one rank's supervisor under the direct launcher."""
    out = dict(env)
    out.update(
        {
            "SPARKDIST_RANK": str(rank),
            "SPARKDIST_WORLD_SIZE": str(world_size),
            "SPARKDIST_LOCAL_RANK": str(local_rank),
            "SPARKDIST_LOCAL_WORLD_SIZE": str(local_size),
        }
    )
    return out


def supervisor_argv(python: str) -> list[str]:
    return [python, "-m", SUPERVISOR_MODULE]


def mpirun_argv(
    python: str,
    np: int,
    hosts: Sequence[tuple[str, int]],
    networks: Sequence[str],
    extra_args: Sequence[str],
    use_rsh_agent: bool,
    btl: Sequence[str] = ("self", "tcp"),
) -> list[str]:
    """mpirun's command line: one `-H` entry per task, the sparkdist rsh agent, the
    networks every task can use, no core binding (Spark manages the cores). `btl`:
    Open MPI's transports (TCP between tasks; see `shared_memory_btl` for ranks that
    share one host)."""
    nets = ",".join(dict.fromkeys(networks))
    argv = [
        "mpirun",
        "-np", str(np),
        "-H", ",".join(f"{name}:{slots}" for name, slots in hosts),
        "--bind-to", "none",
        "--map-by", "slot",
        "--stdin", "none",
        "--mca", "pml", "ob1",
        "--mca", "btl", ",".join(btl),
        "--mca", "oob_tcp_if_include", nets,
        "--mca", "btl_tcp_if_include", nets,
        # orted maps a shared copy of the hwloc topology into a "hole" it finds in its
        # address space; Open MPI 4.1's orted can crash there (SIGSEGV in
        # hwloc_shmem_topology_write, seen in CI). Ranks read the topology themselves.
        "--mca", "rtc_hwloc_vmhole", "none",
    ]  # fmt: skip
    if use_rsh_agent:
        argv += [
            "--mca", "plm_rsh_agent", f"{python} -m {RSH_MODULE}",
            "--mca", "plm_rsh_no_tree_spawn", "1",
            # Keep each orted in the foreground of its task (no --daemonize), so it
            # stays a child of the task, in the task's process group.
            "--mca", "orte_leave_session_attached", "1",
            "--mca", "routed", "direct",
        ]  # fmt: skip
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


def relay_output(
    proc: subprocess.Popen,
    on_lines: Callable[[list[str]], None],
    on_exit: Callable[[int], None],
) -> threading.Thread:
    """Feed a launcher's merged output to `on_lines`, then its exit code to `on_exit`."""

    def relay() -> None:
        for raw in iter(proc.stdout.readline, b""):
            on_lines([raw.decode("utf-8", errors="replace").rstrip("\n")])
        on_exit(proc.wait())

    thread = threading.Thread(target=relay, name="sparkdist-launcher-output", daemon=True)
    thread.start()
    return thread
