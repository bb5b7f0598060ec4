"""Spark Connect from a client the executors cannot reach (relay mode), on the namespaced
cluster: a Spark Connect server in the root namespace drives the three hosts, and the
client runs in a namespace of its own, linked only to the server's side. The client
reaches the server; the hosts have no route back to the client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from sparkdist.spark.connect_server import LocalConnectServer

pytestmark = pytest.mark.cluster

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CLIENT = ROOT / "tests" / "connect_client.py"
CLIENT_NS = "sdc-client"
CLIENT_LINK = "sdccv0"
CLIENT_SUBNET = "10.213.8"
NOTICE = "the job runs in relay mode"


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")


@pytest.fixture(scope="module")
def relay_server(cluster):
    """(the Connect server, its URL as the client sees it); the client namespace exists."""
    subprocess.run(["ip", "netns", "del", CLIENT_NS], capture_output=True)
    subprocess.run(["ip", "link", "del", CLIENT_LINK], capture_output=True)
    ip("netns", "add", CLIENT_NS)
    try:
        ip("link", "add", CLIENT_LINK, "type", "veth", "peer", "name", "tc0")
        ip("link", "set", "tc0", "netns", CLIENT_NS)
        ip("addr", "add", f"{CLIENT_SUBNET}.1/24", "dev", CLIENT_LINK)
        ip("link", "set", CLIENT_LINK, "up")
        ip("-n", CLIENT_NS, "addr", "add", f"{CLIENT_SUBNET}.2/24", "dev", "tc0")
        ip("-n", CLIENT_NS, "link", "set", "tc0", "up")
        ip("-n", CLIENT_NS, "link", "set", "lo", "up")
        server = LocalConnectServer(
            master=cluster.master_url,
            host=f"{CLIENT_SUBNET}.1",
            conf={
                "spark.driver.host": cluster.driver_address,
                "spark.driver.bindAddress": cluster.driver_address,
                "spark.executor.memory": "512m",
                "spark.executor.cores": "1",
                "spark.cores.max": "3",
                "spark.executor.heartbeatInterval": "2s",
                "spark.network.timeout": "20s",
                "spark.network.timeoutInterval": "5s",
            },
            env={
                "SPARK_LOCAL_IP": cluster.driver_address,
                "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(ROOT), str(HERE), os.environ.get("PYTHONPATH")])
                ),
            },
            log_path=cluster.dir / "connect-server.log",
        )
        server.start()
        try:
            yield server
        finally:
            server.stop()
    finally:
        subprocess.run(["ip", "netns", "del", CLIENT_NS], capture_output=True)
        subprocess.run(["ip", "link", "del", CLIENT_LINK], capture_output=True)


def client_command(scenario: str) -> list[str]:
    return ["ip", "netns", "exec", CLIENT_NS, sys.executable, str(CLIENT), scenario]


def client_env(server, **args) -> dict[str, str]:
    env = dict(os.environ, SPARK_REMOTE=server.url, SCENARIO_ARGS=json.dumps(args))
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), str(HERE), os.environ.get("PYTHONPATH")])
    )
    return env


def read_result(output: str) -> dict:
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert lines, output[-4000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["no_jvm"]
    return result


def run_client(server, scenario: str, **args) -> tuple[dict, str]:
    proc = subprocess.run(
        client_command(scenario),
        env=client_env(server, **args),
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    return read_result(output), output


def test_the_client_namespace_cannot_be_reached_from_the_hosts(cluster, relay_server):
    done = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            cluster.namespace(1),
            sys.executable,
            "-c",
            f"import socket; socket.create_connection(('{CLIENT_SUBNET}.2', 22), timeout=3)",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "unreachable" in done.stderr.lower() or "timed out" in done.stderr.lower()


def test_relayed_job_returns_every_rank_value_and_its_logs(relay_server):
    result, output = run_client(relay_server, "relay_values")
    expected = [{"rank": r, "value": 5 * r} for r in range(3)]
    assert result["direct"] == expected
    assert result["mpi"] == expected
    # Told once per job, at its start; the ranks' lines arrive at the end, rank-prefixed.
    assert output.count(NOTICE) == 2
    for rank in range(3):
        assert f"[rank {rank}] rank {rank} of 3 says hello" in output


def test_relayed_failure_brings_the_rank_traceback(relay_server):
    result, output = run_client(relay_server, "failure")
    assert result["error"] == "RankFailedError"
    assert "Traceback from rank 1" in result["message"]
    assert "deliberate failure on rank 1 (connect test)" in result["message"]
    assert output.count(NOTICE) == 1


def test_relaunch_needs_a_shared_checkpoint_dir(relay_server):
    result, _ = run_client(relay_server, "relay_no_checkpoint_dir")
    assert "checkpoint_dir" in result["error"] and "every executor shares" in result["error"]


def test_relayed_job_resumes_from_a_shared_checkpoint_after_a_lost_executor(
    cluster, relay_server, tmp_path
):
    from checks import host_of, wait_progress

    progress = tmp_path / "progress"
    progress.mkdir()
    checkpoints = tmp_path / "checkpoints"  # one file system for every host
    # Slow enough epochs that the executor is killed mid-training even on a loaded machine
    # (it is killed once every rank is past epoch 3: 12 epochs, 12 s, still to go).
    args = {
        "checkpoint_dir": str(checkpoints),
        "progress_dir": str(progress),
        "epochs": 15,
        "epoch_s": 1.0,
    }
    proc = subprocess.Popen(
        client_command("relay_resume"),
        env=client_env(relay_server, **args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        seen = wait_progress(progress, 3, 3)
        host = host_of(cluster, seen[2]["pid"])
        parents = {p.pid for p in psutil.Process(seen[2]["pid"]).parents()}
        (executor,) = [p for p in cluster.executors(host) if p.pid in parents]
        executor.kill()
        output, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-4000:]
    result = read_result(output)
    assert result["attempts"] == 2, result
    assert result["rank0"]["resumed_from"] >= 3
    assert result["rank0"]["history"] == list(range(1, 16))  # every epoch once
    assert result["alive"] == []
