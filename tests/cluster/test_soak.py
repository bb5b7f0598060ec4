"""The short chaos soak (issue 64) on the session's namespaced cluster: every fault kind
of the issue's table once, in an order drawn from a fixed seed, done to an in-process
elastic DDP job (benchmarks/soak.py, tests/cluster/soak_job.py) at a quarter of the
issue's durations; then the fault-free control to the same step; every invariant of the
issue asserted. The same for the job on the relaunch path, with the kinds it meets
otherwise than as a lost rank or host (those are test_elastic_cluster.py's).

What a fault takes away comes back (hosts, links, the disk), so later tests see three
live workers and the main driver one executor on each host.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_elastic_cluster import restore_one_executor_per_host

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import soak  # noqa: E402
import soak_schedule as schedule  # noqa: E402

pytestmark = pytest.mark.cluster

SEED = 64
TIME_SCALE = 0.25
CONTROL_STEP_S = 0.02
"""The control's step sleep: it only needs the soak's rows and final weights, which no
sleep changes (at the soak's 0.2 s it took as long as the soak had trained, about 120 s)."""


@pytest.mark.timeout(1500)
def test_short_soak_every_fault_kind_once(cluster, driver, host_driver, tmp_path):
    faults = schedule.every_kind(SEED, gap_s=5.0)
    opts = soak.SoakOptions(time_scale=TIME_SCALE, step_s=0.2, control_step_s=CONTROL_STEP_S)
    opts.stall_timeout_s = 20.0  # the long soaks' (30: the stopped and stuck ranks 20 s longer)
    out = soak.soak(cluster, host_driver, faults, opts, tmp_path)
    print(schedule.describe(faults))
    print(soak.summary(out))
    print(soak.last_line(out, SEED))

    assert out["faults"] == {kind: 1 for kind in schedule.KINDS}, out["table"]
    assert all(row["survived"] == 1 for row in out["kinds"].values()), out["table"]
    failed = {name: c["why"] for name, c in out["invariants"].items() if not c["ok"]}
    assert not failed, failed
    everywhere = [cluster.address(i) for i in range(3)]
    assert cluster.alive_worker_hosts() == everywhere
    assert restore_one_executor_per_host(cluster, driver) == everywhere


RELAUNCH_KINDS = ("sigstop", "exit", "in_checkpoint", "disk_full")
"""A stopped rank (the stall watch kills it), an os._exit, a death while rank 0 saves,
a full checkpoint store: each relaunches the job (but the full store), at the same size."""


@pytest.mark.timeout(900)
def test_short_relaunch_soak(cluster, driver, host_driver, tmp_path):
    faults = schedule.every_kind(SEED, gap_s=5.0, only=RELAUNCH_KINDS)
    opts = soak.SoakOptions(
        time_scale=TIME_SCALE, step_s=0.2, control_step_s=CONTROL_STEP_S, mode="relaunch"
    )
    opts.stall_timeout_s = 20.0
    out = soak.soak(cluster, host_driver, faults, opts, tmp_path)
    print(schedule.describe(faults))
    print(soak.summary(out))
    print(soak.last_line(out, SEED))

    assert out["faults"] == dict.fromkeys(RELAUNCH_KINDS, 1), out["table"]
    assert all(row["survived"] == 1 for row in out["kinds"].values()), out["table"]
    failed = {name: c["why"] for name, c in out["invariants"].items() if not c["ok"]}
    assert not failed, failed
    everywhere = [cluster.address(i) for i in range(3)]
    assert cluster.alive_worker_hosts() == everywhere
