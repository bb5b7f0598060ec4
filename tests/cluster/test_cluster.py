"""sparkdist on a real multi-host Spark standalone cluster (three hosts in network
namespaces, see netns_cluster.py): training across hosts, interface choice, and faults
(lost executor, network cut, two drivers, a driver that dies).

The tests share one cluster and run in file order; each fault test checks that the
cluster serves the next job afterwards.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest
from checks import (
    RUNNER,
    host_of,
    in_network,
    records,
    wait_all_gone,
    wait_no_job_processes,
    wait_progress,
)
from installed import requires
from remote_driver import DriverGone

from sparkdist.protocol import wire
from sparkdist.protocol.job_secret import JobSecret

pytestmark = pytest.mark.cluster


def test_torch_np3_across_three_hosts(cluster, driver):
    result = driver.call("run_job", main="network_main", np=3, runner=RUNNER)
    assert result["ok"], result.get("error")
    values = result["values"]
    hosts = sorted(v["host"] for v in values)
    assert hosts == sorted(cluster.address(i) for i in range(3))
    assert [v["sum"] for v in values] == [6.0] * 3
    for v in values:
        # Everything a rank was given and everything it talked to is on the test network
        # (loopback aside), not on the interface only one host has.
        assert in_network(v["master_addr"], cluster.network)
        assert v["gloo_ifname"] == "tn0"
        assert v["btl_tcp_if_include"] == cluster.network
        assert v["oob_tcp_if_include"] == cluster.network
        assert v["peers"], v
        for peer in v["peers"]:
            assert in_network(peer, cluster.network) or in_network(peer, "127.0.0.0/8"), v
    # mpirun's rsh agent reached each host's task agent: one orted per host.
    orted_hosts = sorted(p.host for p in records(result) if p.role == "orted")
    assert orted_hosts == hosts
    assert wait_all_gone(records(result), 15) == []


FAULTS = Path("/tmp/sparkdist-netns/faults.json")


def record_fault(
    case: str, seconds: float | None, left: list, data_lost: str, error: str = ""
) -> None:
    """Keep the measured fault table (printed with -s, and kept in FAULTS)."""
    rows = json.loads(FAULTS.read_text()) if FAULTS.exists() else {}
    rows[case] = {
        "seconds_to_error": None if seconds is None else round(seconds, 1),
        "processes_left": len(left),
        "data_lost": data_lost,
        "error": error.splitlines()[0] if error else "",
    }
    FAULTS.write_text(json.dumps(rows, indent=1))
    print(f"fault table: {case}: {rows[case]}")


def start_training(driver, tmp_path: Path, name: str, **kwargs):
    progress = tmp_path / name
    progress.mkdir()
    args = {"epochs": 400, "progress_dir": str(progress), "epoch_s": 0.2, **kwargs}
    future = driver.submit("run_job", main="train_main", np=3, runner=RUNNER, kwargs=args)
    return future, progress


def test_named_interface_used_and_one_only_some_hosts_have_refused(cluster, driver):
    ok = driver.call("run_job", main="network_main", runner={**RUNNER, "network_interface": "tn0"})
    assert ok["ok"], ok.get("error")
    assert sorted(v["host"] for v in ok["values"]) == [cluster.address(i) for i in range(3)]
    # tn1 exists only on the last host (and reaches nobody): a clear error, no hang.
    bad = driver.call("run_job", main="network_main", runner={**RUNNER, "network_interface": "tn1"})
    assert not bad["ok"]
    assert "network interface 'tn1' does not exist on host" in bad["error"]


@pytest.mark.horovod
@requires("horovod", "run `make horovod` (init_scripts/install_horovod.sh)")
def test_horovod_np3_across_three_hosts(cluster, driver):
    result = driver.call("run_job", main="horovod_main", runner=RUNNER)
    assert result["ok"], result.get("error")
    values = result["values"]
    assert sorted(v["host"] for v in values) == [cluster.address(i) for i in range(3)]
    for v in values:
        assert v["size"] == 3 and v["sum"] == 6.0
        assert v["same_weights"] and v["last_loss"] < v["first_loss"] / 10
        for peer in v["peers"]:
            assert in_network(peer, cluster.network) or in_network(peer, "127.0.0.0/8"), v


@requires("tensorflow", "pip install tensorflow-cpu (make venv)")
def test_tensorflow_multi_worker_np3_across_three_hosts(cluster, driver):
    result = driver.call("run_job", main="tensorflow_main", runner=RUNNER, kwargs={"epochs": 3})
    assert result["ok"], result.get("error")
    values = result["values"]
    assert sorted(v["host"] for v in values) == [cluster.address(i) for i in range(3)]
    workers = values[0]["tf_config"]["cluster"]["worker"]
    assert sorted(w.rsplit(":", 1)[0] for w in workers) == [cluster.address(i) for i in range(3)]
    for v in values:
        assert v["replicas"] == 3
        assert v["tf_config"]["cluster"]["worker"] == workers
        assert v["loss"][-1] < v["loss"][0]
        assert v["loss"] == pytest.approx(values[0]["loss"])  # one model, in sync


def test_two_drivers_at_once_with_separate_secrets(cluster, driver, second_driver, tmp_path):
    first_job, first_progress = start_training(driver, tmp_path, "a", epochs=80)
    second_job, second_progress = start_training(second_driver, tmp_path, "b", epochs=80)
    wait_progress(first_progress, 3, 2, first_job)
    wait_progress(second_progress, 3, 2, second_job)
    jobs = running_jobs(cluster)
    assert len(jobs) == 2, list(jobs)
    a, b = jobs.values()
    assert a.secret != b.secret
    for job, other in ((a, b), (b, a)):
        for host, port in other.agents:
            assert in_network(host, cluster.network)
            with pytest.raises(wire.AuthenticationError):
                wire.connect((host, port), job.secret, timeout=10)
        for host, port in job.agents:  # the same agents do answer their own job's secret
            wire.connect((host, port), job.secret, timeout=10).close()
    results = [first_job.result(timeout=240), second_job.result(timeout=240)]
    for result in results:
        assert result["ok"], result.get("error")
        assert sorted(v["host"] for v in result["values"]) == [cluster.address(i) for i in range(3)]
    # Both trained the same model on the same data: the same losses.
    losses = [[v["loss"] for v in r["values"]] for r in results]
    assert losses[0] == pytest.approx(losses[1])
    assert wait_no_job_processes(cluster, 30) == []


class RunningJob:
    """A job seen from outside: its id, task agents and secret (never shown in output)."""

    def __init__(self, job_id: str, secret: JobSecret, agents: list[tuple[str, int]]):
        self.job_id, self.secret, self.agents = job_id, secret, agents

    def __repr__(self) -> str:
        return f"RunningJob({self.job_id}, agents={self.agents})"


def running_jobs(cluster) -> dict[str, RunningJob]:
    """The jobs running on the cluster, read from their orted daemons: the environment
    (root may read it; the secret is on no command line) and, for each task agent, the
    port its Spark task (the daemon's parent) listens on at the task's address."""
    jobs = {}
    for i in range(cluster.state.hosts):
        for proc in cluster.descendants(i):
            try:
                env = proc.environ()
                cmd = proc.cmdline()
                if not ("SPARKDIST_SECRET" in env and cmd and cmd[0].endswith("orted")):
                    continue
                listening = proc.parent().net_connections(kind="tcp")
            except psutil.Error:
                continue
            secret = env["SPARKDIST_SECRET"]
            assert all(secret not in part for part in cmd)
            host = env["SPARKDIST_TASK_HOST"]
            agents = [
                (host, c.laddr.port)
                for c in listening
                if c.status == psutil.CONN_LISTEN and c.laddr.ip == host
            ]
            job_id = env["SPARKDIST_JOB_ID"]
            job = jobs.setdefault(job_id, RunningJob(job_id, JobSecret.from_text(secret), []))
            job.agents.extend(a for a in agents if a not in job.agents)
    return jobs


def test_executor_killed_mid_training(cluster, driver, tmp_path):
    app = driver.call("app_id")
    job, progress = start_training(driver, tmp_path, "progress")
    seen = wait_progress(progress, 3, 2, job)
    host = host_of(cluster, seen[1]["pid"])
    executors = [p for p in cluster.executors(host) if app in " ".join(p.cmdline())]
    assert len(executors) == 1
    executors[0].kill()
    killed_at = time.time()
    result = job.result(timeout=240)

    assert not result["ok"]
    assert result["error_type"] == "RankFailedError", result["error"]
    assert result["rank"] == 1 and result["host"] == cluster.address(host), result["error"]
    assert "executor died" in result["error"].splitlines()[0]
    left = wait_all_gone(records(result), 30)
    assert left == []
    assert wait_no_job_processes(cluster, 30) == []
    record_fault(
        "executor killed (SIGKILL) mid-training",
        result["failed_at"] - killed_at,
        left,
        "the job's run in progress (nothing with max_failures and checkpoints)",
        result["error"],
    )
    again = driver.call("run_job", main="network_main", runner=RUNNER)
    assert again["ok"], again.get("error")


def test_lost_executor_relaunches_from_checkpoint(cluster, driver, tmp_path):
    app = driver.call("app_id")
    progress = tmp_path / "progress"
    progress.mkdir()
    job = driver.submit(
        "run_job",
        main="resumable_main",
        runner={**RUNNER, "max_failures": 1},
        kwargs={"epochs": 12, "progress_dir": str(progress)},
    )
    seen = wait_progress(progress, 3, 3, job)
    host = host_of(cluster, seen[2]["pid"])
    (executor,) = [p for p in cluster.executors(host) if app in " ".join(p.cmdline())]
    executor.kill()
    killed_at = time.time()
    result = job.result(timeout=300)
    finished_s = time.time() - killed_at
    assert result["ok"], result.get("error")
    assert result["attempts"] == 2
    assert f"on host {cluster.address(host)}" in result["failures"][0]
    rank0 = result["values"][0]
    assert rank0["attempt"] == 1 and rank0["resumed_from"] >= 3
    assert rank0["history"] == list(range(1, 13))  # every epoch once, none lost
    assert rank0["loss"] < 1.0  # from 179 at the start; 0.57 uninterrupted
    left = wait_all_gone(records(result), 30)
    assert left == []
    done = max(json.loads((progress / f"rank-{r}.json").read_text())["epoch"] for r in range(3))
    record_fault(
        "executor killed, max_failures=1: relaunched and finished",
        finished_s,
        left,
        f"resumed from epoch {rank0['resumed_from']} of 12 (at least {seen[2]['epoch']} were "
        f"done when killed); nothing else",
        result["failures"][0],
    )
    assert done == 12


def test_network_cut_between_ranks(cluster, driver, tmp_path):
    # Gloo's own timeout (30 s) is longer than sparkdist's dead-peer detection (15 s).
    job, progress = start_training(driver, tmp_path, "progress", gloo_timeout_s=30.0)
    seen = wait_progress(progress, 3, 2, job)
    # Cut off a host that runs a rank but not the master (host 0).
    rank, host = next(
        (r, h) for r, h in ((r, host_of(cluster, s["pid"])) for r, s in seen.items()) if h != 0
    )
    cluster.set_link(host, up=False)
    cut_at = time.time()
    try:
        result = job.result(timeout=240)
        assert not result["ok"]
        # An error from the failure itself, not from the job's time limit.
        assert result["error_type"] == "RankFailedError", result["error"]
        assert result["host"] == cluster.address(host), result["error"]
        assert "lost contact" in result["error"].splitlines()[0]
        # Nothing is left, on the cut-off host either, while it is still cut off.
        left = wait_all_gone(records(result), 60)
        assert left == []
    finally:
        cluster.set_link(host, up=True)
    record_fault(
        f"network cut (veth of host {host}, rank {rank}, set down)",
        result["failed_at"] - cut_at,
        left,
        "the job's run in progress",
        result["error"],
    )
    assert wait_no_job_processes(cluster, 30) == []
    again = driver.call("run_job", main="network_main", runner=RUNNER)
    assert again["ok"], again.get("error")


def test_driver_that_dies_takes_its_ranks_along(cluster, second_driver, tmp_path):
    doomed = second_driver
    job, progress = start_training(doomed, tmp_path, "progress")
    seen = wait_progress(progress, 3, 2, job)
    ranks = [psutil.Process(s["pid"]) for s in seen.values()]
    supervisors = [psutil.Process(s["ppid"]) for s in seen.values()]
    doomed.kill()
    killed_at = time.time()
    gone, alive = psutil.wait_procs(ranks + supervisors, timeout=60)
    seconds = time.time() - killed_at
    assert alive == []
    left = wait_no_job_processes(cluster, 60)
    assert left == []
    with pytest.raises(DriverGone):
        job.result(timeout=10)
    record_fault("driver killed (SIGKILL)", None, left, "the job's run in progress")
    record_fault("driver killed: time until its ranks exited", seconds, left, "-")
