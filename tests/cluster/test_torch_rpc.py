"""torch.distributed.rpc model parallelism across the namespaced hosts: a pipeline with a
`RemoteModule` stage on each other host, distributed autograd and `DistributedOptimizer`,
beside a Gloo process group on the same MASTER_ADDR/MASTER_PORT. The last host has a second
interface (tn1) that reaches nobody: TensorPipe must listen and connect on the interface
Gloo uses (TP_SOCKET_IFNAME from the torch backend), never there."""

from __future__ import annotations

import pytest
from checks import RUNNER, in_network

pytestmark = pytest.mark.cluster


def test_rpc_pipeline_across_three_hosts(cluster, driver):
    result = driver.call("run_job", main="rpc_pipeline_main", np=3, runner=RUNNER)
    assert result["ok"], result.get("error")
    values = result["values"]
    assert sorted(v["host"] for v in values) == [cluster.address(i) for i in range(3)]
    first = values[0]
    assert first["owners"] == ["worker1", "worker2"]  # stages 2 and 3 on ranks 1 and 2
    assert first["losses"][-1] < first["losses"][0] / 2, first["losses"]
    assert first["losses"] == pytest.approx(first["reference_losses"], abs=1e-5)
    assert first["max_weight_diff"] < 1e-5
    for v in values:
        assert v["tp_socket_ifname"] == v["gloo_socket_ifname"] == "tn0", v
        assert v["gloo_sum"] == 3.0
        assert v["peers"], v
        for peer in v["peers"]:
            assert in_network(peer, cluster.network) or in_network(peer, "127.0.0.0/8"), v
