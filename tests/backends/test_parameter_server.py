"""TensorFlow's ParameterServerStrategy on the runner (`roles=`), with real TensorFlow on
real Spark (local-cluster: two one-core executors, so four ranks run two per task):
the chief trains digits with a ClusterCoordinator while sparkdist runs the worker and ps
servers; the servers are gone after the job; variables shard over two parameter
servers; a worker killed mid-training is tolerated; a raising chief fails the job with its
traceback. The same across the namespaced hosts is in
tests/cluster/test_parameter_server_cluster.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import sparkdist
from sparkdist import RankFailedError

SCRIPTS = str(Path(__file__).parents[1] / "scripts")


def chief_custom_loop(scripts: str, kill_worker_at: int | None = None, **kwargs) -> dict:
    """The chief: tests/scripts/tf_parameter_server.py's custom loop; optionally kills
    worker 1's server (found by the port TF_CONFIG gives it) right after scheduling
    step `kill_worker_at`."""
    sys.path.insert(0, scripts)
    import json
    import os as os_

    from tf_parameter_server import custom_loop, tf_config

    def kill_worker(step: int) -> None:
        if step != kill_worker_at:
            return
        import signal

        import psutil

        port = int(tf_config()["cluster"]["worker"][1].rsplit(":", 1)[1])
        for conn in psutil.net_connections("tcp"):
            if conn.status == "LISTEN" and conn.laddr.port == port and conn.pid:
                os_.kill(conn.pid, signal.SIGKILL)
                with open(os_.environ["KILLED_FILE"], "w") as out:
                    json.dump({"pid": conn.pid, "step": step}, out)
                return
        raise AssertionError(f"no process listens on worker 1's port {port}")

    result = custom_loop(on_step=kill_worker if kill_worker_at else None, **kwargs)
    result["tf_config"] = tf_config()
    return result


def gone(runner) -> list:
    """The job's recorded processes still alive."""
    return [p for p in runner.last_job.processes if p.alive()]


def test_chief_two_workers_one_ps_and_a_worker_killed_mid_training(sc, tmp_path, caplog):
    killed = tmp_path / "killed.json"
    runner = sparkdist.HorovodRunner(
        np=4,
        ranks_per_task=2,
        roles={"chief": 1, "worker": 2, "ps": 1},
        env={"KILLED_FILE": str(killed)},
    )
    with caplog.at_level("WARNING", logger="sparkdist.runner.driver.job_state"):
        result = runner.run(chief_custom_loop, scripts=SCRIPTS, steps=300, kill_worker_at=100)
    assert result["accuracy"] >= 0.9, result
    assert result["optimizer_iterations"] >= 300  # every step ran, the lost ones elsewhere
    cluster = result["tf_config"]["cluster"]
    assert [len(cluster[r]) for r in ("chief", "worker", "ps")] == [1, 2, 1]
    assert result["tf_config"]["task"] == {"type": "chief", "index": 0}
    assert killed.exists()
    lost = [r.getMessage() for r in caplog.records if "worker rank 2" in r.getMessage()]
    assert lost and "SIGKILL" in lost[0] and "1 worker(s) left" in lost[0]
    assert runner.last_job.outcome == "succeeded"
    # The servers never return on their own: the driver stopped them when the chief did.
    assert gone(runner) == []
    ranks = [p for p in runner.last_job.processes if p.role == "rank"]
    assert len(ranks) == 4


def test_variables_shard_over_two_parameter_servers(sc):
    runner = sparkdist.HorovodRunner(
        np=4, ranks_per_task=2, roles={"chief": 1, "worker": 1, "ps": 2}
    )
    result = runner.run(chief_custom_loop, scripts=SCRIPTS, steps=300, shards=2)
    assert result["accuracy"] >= 0.9, result
    devices = set(result["variable_devices"])
    assert any("/job:ps/replica:0/task:0" in d for d in devices), devices
    assert any("/job:ps/replica:0/task:1" in d for d in devices), devices
    assert result["num_ps"] == 2
    assert gone(runner) == []


def raising_chief() -> None:
    import json

    roles = json.loads(os.environ["TF_CONFIG"])["cluster"]
    raise RuntimeError(f"the chief gives up (cluster {sorted(roles)})")


def test_a_raising_chief_fails_the_job_with_its_traceback_and_stops_the_servers(sc):
    runner = sparkdist.HorovodRunner(np=-3, roles="chief=1,worker=1,ps=1")
    with pytest.raises(RankFailedError) as err:
        runner.run(raising_chief)
    text = str(err.value)
    assert "rank 0" in text and "Traceback from rank 0" in text
    assert "the chief gives up (cluster ['chief', 'ps', 'worker'])" in text
    assert gone(runner) == []


def test_a_lost_parameter_server_fails_the_job(sc):
    """Unlike a worker, a ps holds state the strategy cannot rebuild: its loss (here the
    whole job's only ps ending at once) fails the job instead of hanging it."""

    def chief_killing_the_ps() -> None:
        import json
        import signal
        import threading
        import time

        import psutil

        port = int(json.loads(os.environ["TF_CONFIG"])["cluster"]["ps"][0].rsplit(":", 1)[1])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for conn in psutil.net_connections("tcp"):
                if conn.status == "LISTEN" and conn.laddr.port == port and conn.pid:
                    os.kill(conn.pid, signal.SIGKILL)
                    threading.Event().wait()  # until the driver ends this rank
            time.sleep(0.1)

    runner = sparkdist.HorovodRunner(np=-3, roles={"chief": 1, "worker": 1, "ps": 1}, timeout=200)
    with pytest.raises(RankFailedError) as err:
        runner.run(chief_killing_the_ps)
    assert "rank 2" in str(err.value) and "SIGKILL" in str(err.value)
    assert gone(runner) == []
