"""Parameter servers across the namespaced hosts: TensorFlow's ParameterServerStrategy
with 1 chief, 2 workers and 1 ps placed by the runner (`roles=`) on two hosts, and the
PyTorch RPC parameter server (1 server, 2 trainers), each trained on digits."""

from __future__ import annotations

import pytest
from checks import RUNNER, records, wait_all_gone

pytestmark = pytest.mark.cluster


def test_tensorflow_parameter_server_across_two_hosts(cluster, driver):
    # The main driver has one slot per host: its four ranks run two per task, two hosts.
    runner = {**RUNNER, "roles": {"chief": 1, "worker": 2, "ps": 1}, "ranks_per_task": 2}
    result = driver.call("run_job", main="tf_parameter_server_main", np=4, runner=runner)
    assert result["ok"], result.get("error")
    chief, *servers = result["values"]
    assert servers == [None, None, None]  # servers run TensorFlow, not main
    assert chief["accuracy"] >= 0.9, chief
    cluster_spec = chief["tf_config"]["cluster"]
    hosts = [a.rsplit(":", 1)[0] for role in ("chief", "worker", "ps") for a in cluster_spec[role]]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3], hosts  # rank order, two per task
    assert set(hosts) <= {cluster.address(i) for i in range(3)}
    assert [len(cluster_spec[r]) for r in ("chief", "worker", "ps")] == [1, 2, 1]
    assert wait_all_gone(records(result), timeout_s=30) == []


def test_torch_rpc_parameter_server_across_three_hosts(cluster, driver):
    result = driver.call("run_job", main="rpc_parameter_server_main", np=3, runner=RUNNER)
    assert result["ok"], result.get("error")
    server, *trainers = result["values"]
    assert server["accuracy"] >= 0.9, server
    assert server["updates"] == sum(server["steps"].values()), server
    assert sorted(v["host"] for v in result["values"]) == [cluster.address(i) for i in range(3)]
    assert len(trainers) == 2
