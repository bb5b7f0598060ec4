"""What the cluster tests check from the test process: a job's process records and
whether they are gone, the sparkdist processes left under the cluster's workers, the
ranks' progress files, and which host a process runs on. (`jobs.py` is what the driver
process runs.)"""

from __future__ import annotations

import ipaddress
import json
import time
from pathlib import Path

import psutil

from sparkdist.protocol.processes import ProcessRecord

RUNNER = {"start_timeout": 120, "timeout": 240}


def in_network(address: str, network: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped  # Gloo's sockets are dual-stack
    return ip in ipaddress.IPv4Network(network)


def records(result: dict) -> list[ProcessRecord]:
    return [ProcessRecord(**p) for p in result.get("processes", [])]


def wait_all_gone(recs: list[ProcessRecord], timeout_s: float) -> list[ProcessRecord]:
    deadline = time.monotonic() + timeout_s
    alive = [r for r in recs if r.alive()]
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [r for r in alive if r.alive()]
    return alive


def job_processes(cluster) -> list[psutil.Process]:
    """Processes of any sparkdist job still running under the cluster's workers."""
    found = []
    for i in range(cluster.state.hosts):
        for proc in cluster.descendants(i):
            try:
                argv = proc.cmdline()
            except psutil.Error:
                continue
            # By module and program name, not by substring: a checkout path holding
            # "orted" would otherwise count the cluster's own JVMs.
            programs = {arg.rsplit("/", 1)[-1] for arg in argv}
            if "sparkdist.runner" in " ".join(argv) or programs & {"orted", "mpirun"}:
                found.append(proc)
    return found


def wait_no_job_processes(cluster, timeout_s: float) -> list[str]:
    deadline = time.monotonic() + timeout_s
    left = job_processes(cluster)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    return [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in left if p.is_running()]


def wait_progress(progress: Path, ranks: int, epoch: int, job=None, timeout_s: float = 120) -> dict:
    """Wait until every rank wrote progress for `epoch`; return rank -> progress.
    Fails at once with the job's error if the job (a future) ended first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if job is not None and job.done():
            raise AssertionError(f"the job ended before epoch {epoch}: {job.result()}")
        seen = {}
        for path in progress.glob("rank-*.json"):
            try:
                seen[int(path.stem.split("-")[1])] = json.loads(path.read_text())
            except (ValueError, OSError):
                pass
        if len(seen) == ranks and all(p["epoch"] >= epoch for p in seen.values()):
            return seen
        time.sleep(0.1)
    raise TimeoutError(f"the ranks did not reach epoch {epoch}: {progress}")


def host_of(cluster, pid: int) -> int:
    """Which test host's worker the process `pid` runs under."""
    parents = {p.pid for p in psutil.Process(pid).parents()}
    for i in range(cluster.state.hosts):
        if cluster.state.pids[f"worker-{i}"] in parents:
            return i
    raise AssertionError(f"process {pid} runs under no worker of the cluster")
