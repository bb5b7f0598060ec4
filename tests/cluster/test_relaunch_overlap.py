"""A relaunched elastic job (the relaunch path, not in process) never has two ranks on
one host at once: the last attempt's rank on a host is gone before the next attempt's
starts there, after a SIGKILLed rank and after a host cut off for 40 s (longer than the
dead-peer detection and Spark's network timeout) that heals and is seated again. On a
GPU two ranks would hold one device's memory together. Each host's rank processes, and
the application's executor JVMs, are sampled from the test process every 50 ms,
wherever they are (under the executor or orphaned), by network namespace.

This was the suspected cause of the relaunch soak's peak memory (issue 64: a host at
1.35-1.41x the control's, with two processes of 250-330 MiB); both cases passed before
any change. The soak's peaks were py-spy reading each rank's native stacks as a
relaunched job showed where its ranks were (`protocol/stack_dumps.py`).

Shares the session's cluster (conftest.py) and the elastic tests' one-executor-a-host
driver (`host_driver`).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import psutil
import pytest
from checks import records, wait_all_gone, wait_no_job_processes
from test_elastic_cluster import (
    RELAUNCH,
    ROWS,
    host_driver,  # noqa: F401 - the fixture
    rank_hosts,
    wait_executors,
    wait_step,
)

pytestmark = pytest.mark.cluster

RANK_MODULE = "sparkdist.runner.rank.main"


class RankSampler(threading.Thread):
    """Every 50 ms, the live rank processes in each host's network namespace: pid, job id
    and RSS. `overlaps` keeps each sample in which a host held more than one."""

    def __init__(self, cluster, app_id: str = ""):
        super().__init__(daemon=True, name="rank-sampler")
        self.app_id = app_id
        self.jvms: list[tuple[float, int, list[tuple[int, float]]]] = []
        """Samples in which a host held more than one executor JVM of the application."""
        self.hosts = {
            os.stat(f"/run/netns/{cluster.namespace(i)}").st_ino: i
            for i in range(cluster.state.hosts)
        }
        self.overlaps: list[tuple[float, int, list[tuple[int, str, float]]]] = []
        self.seen: dict[int, tuple[int, str]] = {}
        """Every rank pid seen: its host and job id."""
        self.stopping = threading.Event()

    def _host(self, pid: int) -> int | None:
        try:
            link = os.readlink(f"/proc/{pid}/ns/net")
        except OSError:
            return None
        return self.hosts.get(int(link.split("[", 1)[1].rstrip("]")))

    def sample(self) -> dict[int, list[tuple[int, str, float]]]:
        by_host: dict[int, list[tuple[int, str, float]]] = {}
        jvms: dict[int, list[tuple[int, float]]] = {}
        for proc in psutil.process_iter(["cmdline", "status"]):
            try:
                argv = proc.info["cmdline"] or []
                if (
                    self.app_id
                    and self.app_id in argv
                    and any("CoarseGrainedExecutorBackend" in a for a in argv)
                ):
                    host = self._host(proc.pid)
                    if host is not None:
                        jvms.setdefault(host, []).append((proc.pid, proc.memory_info().rss / 2**20))
                    continue
                if RANK_MODULE not in argv:
                    continue
                if proc.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                host = self._host(proc.pid)
                if host is None:
                    continue
                job = proc.environ().get("SPARKDIST_JOB_ID", "?")
                rss = proc.memory_info().rss / 2**20
            except psutil.Error:
                continue
            self.seen[proc.pid] = (host, job)
            by_host.setdefault(host, []).append((proc.pid, job, rss))
        for host, found in jvms.items():
            if len(found) > 1:
                self.jvms.append((time.time(), host, found))
        return by_host

    def run(self) -> None:
        while not self.stopping.wait(0.05):
            for host, ranks in self.sample().items():
                if len(ranks) > 1:
                    self.overlaps.append((time.time(), host, ranks))

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=10)

    def summary(self) -> str:
        first: dict[int, tuple] = {}
        for at, host, ranks in self.overlaps:
            first.setdefault(host, (at, ranks))
        jvm: dict[int, tuple] = {}
        for at, host, found in self.jvms:
            jvm.setdefault(host, (at, found))
        return (
            f"{len(self.overlaps)} samples with two ranks on a host; first: {first}; "
            f"{len(self.jvms)} with two executor JVMs; first: {jvm}"
        )


def test_sigkilled_rank_relaunch_never_two_ranks_on_a_host(cluster, host_driver, tmp_path):  # noqa: F811
    progress = tmp_path / "progress"
    progress.mkdir()
    stop_file = tmp_path / "stop"
    wait_executors(host_driver, 3)
    sampler = RankSampler(cluster, host_driver.call("app_id"))
    sampler.start()
    job = host_driver.submit(
        "run_job",
        main="elastic_main",
        np=3,
        runner=RELAUNCH,
        kwargs={"progress_dir": str(progress), "min_steps": 1, "stop_file": str(stop_file)},
        id_frames={"train": {"rows": ROWS, "path": str(tmp_path / "ids")}},
    )
    try:
        wait_step(progress, job, step=3, world_size=3, attempt=0)
        victim = next(p for r, p in _pids(progress, 0).items() if r == 2)
        os.kill(victim, signal.SIGKILL)
        wait_step(progress, job, step=3, world_size=3, attempt=1)
        stop_file.touch()
        result = job.result(timeout=240)
    finally:
        stop_file.touch()
        sampler.stop()
    assert result["ok"], result.get("error")
    print(sampler.summary())
    assert sampler.overlaps == [], sampler.summary()
    assert wait_all_gone(records(result), 30) == []
    assert wait_no_job_processes(cluster, 30) == []


def test_cut_host_relaunch_never_two_ranks_on_a_host(cluster, host_driver, tmp_path):  # noqa: F811
    progress = tmp_path / "progress"
    progress.mkdir()
    stop_file = tmp_path / "stop"
    wait_executors(host_driver, 3)
    sampler = RankSampler(cluster, host_driver.call("app_id"))
    sampler.start()
    job = host_driver.submit(
        "run_job",
        main="elastic_main",
        np=3,
        runner={**RELAUNCH, "max_failures": 4},
        kwargs={"progress_dir": str(progress), "min_steps": 1, "stop_file": str(stop_file)},
        id_frames={"train": {"rows": ROWS, "path": str(tmp_path / "ids")}},
    )
    cut = None
    try:
        wait_step(progress, job, step=3, world_size=3, attempt=0)
        hosts = rank_hosts(progress, 0)
        cut = next(i for i in (1, 2) if cluster.address(i) in hosts.values())
        cluster.set_link(cut, up=False)
        cut_at = time.time()
        smaller = wait_step(progress, job, world_size=2)
        time.sleep(max(0.0, cut_at + 40 - time.time()))
        cluster.set_link(cut, up=True)
        healed = time.time()
        whole = wait_step(progress, job, world_size=3, step=smaller["step"] + 1, timeout_s=240)
        stop_file.touch()
        result = job.result(timeout=240)
    finally:
        stop_file.touch()
        if cut is not None:
            cluster.set_link(cut, up=True)
        sampler.stop()
    print(f"cut {cut} for {healed - cut_at:.0f} s; whole again {whole['at'] - healed:.0f} s later")
    print(sampler.summary())
    print(result.get("failures"))
    assert result["ok"], result.get("error")
    assert sampler.overlaps == [], sampler.summary()
    assert wait_all_gone(records(result), 30) == []
    assert wait_no_job_processes(cluster, 30) == []
    wait_executors(host_driver, 3)


def _pids(progress, attempt: int) -> dict[int, int]:
    """rank -> pid of the ranks of `attempt` (from their rank-N.json)."""
    found = {}
    for path in progress.glob("rank-*.json"):
        where = json.loads(path.read_text())
        if where["attempt"] == attempt:
            found[where["rank"]] = where["pid"]
    return found
