"""GPU backend: each rank sees exactly its own GPUs in CUDA_VISIBLE_DEVICES.

Tested the way Spark tests GPU scheduling on machines without GPUs: a local-cluster
whose worker (and driver) run a fake discovery script that reports GPU addresses, with
`spark.task.resource.gpu.amount` set. That needs its own SparkSession, so it runs in a
child process (the test session's Spark has no GPU resources).
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from fake_gpus import FAKE_GPU_DISCOVERY, run_with_fake_gpus

from sparkdist.backends.gpu import owned_devices, split_by_local_rank

REPO = Path(__file__).resolve().parents[2]
REAL_DISCOVERY = REPO / "conf" / "gpu_discovery.sh"

CHILD = textwrap.dedent(
    """
    import json, sys
    from pyspark.sql import SparkSession
    from sparkdist import HorovodRunner

    fake = sys.argv[1]
    spark = (
        SparkSession.builder.master("local-cluster[1,2,1024]")
        .appName("sparkdist-gpu-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executor.memory", "512m")
        # One worker with two (fake) GPUs, one GPU per task: two tasks, two GPUs.
        .config("spark.worker.resource.gpu.amount", "2")
        .config("spark.worker.resource.gpu.discoveryScript", fake)
        .config("spark.executor.resource.gpu.amount", "2")
        .config("spark.task.resource.gpu.amount", "1")
        # The cluster manager restricted the executors to physical GPUs 4 and 6:
        # Spark's addresses 0 and 1 are indices into that list.
        .config("spark.executorEnv.CUDA_VISIBLE_DEVICES", "4,6")
        # The driver has GPUs 0 and 1 (for np < 0).
        .config("spark.driver.resource.gpu.amount", "2")
        .config("spark.driver.resource.gpu.discoveryScript", fake)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")

    def main():
        import os

        names = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "LOCAL_RANK")
        return {k: os.environ.get(k) for k in names}

    out = {}
    for np_, launcher in [(2, "mpi"), (2, "direct"), (-2, "direct")]:
        runner = HorovodRunner(np=np_, launcher=launcher, start_timeout=120, timeout=120)
        out[f"{np_}/{launcher}"] = runner.run_all(main)
    print("RESULT " + json.dumps(out), flush=True)
    spark.stop()
    """
)


def test_ranks_see_their_own_gpus_on_local_cluster(tmp_path):
    results = run_with_fake_gpus(CHILD, tmp_path)

    for key in ("2/mpi", "2/direct"):
        ranks = results[key]
        # One Spark GPU per task, mapped through the executor's CUDA_VISIBLE_DEVICES.
        seen = [r["CUDA_VISIBLE_DEVICES"] for r in ranks]
        assert sorted(seen) == ["4", "6"], (key, ranks)
        assert all(r["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" for r in ranks)
    for key in ("-2/direct",):
        ranks = results[key]
        # The driver's two GPUs, split by local rank.
        assert [r["CUDA_VISIBLE_DEVICES"] for r in ranks] == ["0", "1"], (key, ranks)
        assert [r["LOCAL_RANK"] for r in ranks] == ["0", "1"]


@pytest.mark.parametrize(
    "addresses, visible, expected",
    [
        (["0", "1"], None, ["0", "1"]),
        (["1"], "4,6", ["6"]),
        (["0", "1"], " 4, 6 ", ["4", "6"]),
        (["GPU-aa"], "4,6", ["GPU-aa"]),
        (["2"], "", ["2"]),
    ],
)
def test_owned_devices(addresses, visible, expected):
    assert owned_devices(addresses, visible) == expected


def test_owned_devices_out_of_range_is_an_error():
    with pytest.raises(ValueError, match="lists only 2 devices"):
        owned_devices(["3"], "4,6")


@pytest.mark.parametrize(
    "devices, local_rank, local_size, expected",
    [
        (["0", "1", "2", "3"], 0, 1, ["0", "1", "2", "3"]),
        (["0", "1", "2", "3"], 1, 2, ["2", "3"]),
        (["0", "1", "2", "3"], 2, 4, ["2"]),
        (["0", "1", "2"], 1, 2, ["1"]),  # 3 GPUs, 2 ranks: one each, one left over
        (["7"], 1, 2, ["7"]),  # fewer GPUs than ranks: shared
    ],
)
def test_split_by_local_rank(devices, local_rank, local_size, expected):
    assert split_by_local_rank(devices, local_rank, local_size) == expected


def test_real_discovery_script_reports_indices_into_visible_devices():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="4,6")
    out = subprocess.run(
        ["bash", str(REAL_DISCOVERY)], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert json.loads(out) == {"name": "gpu", "addresses": ["0", "1"]}
    env["CUDA_VISIBLE_DEVICES"] = ""
    out = subprocess.run(
        ["bash", str(REAL_DISCOVERY)], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert json.loads(out) == {"name": "gpu", "addresses": []}


def test_fake_discovery_script_format():
    env = dict(os.environ, SPARKDIST_FAKE_GPUS="0,1,2")
    out = subprocess.run(
        ["bash", str(FAKE_GPU_DISCOVERY)], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert json.loads(out) == {"name": "gpu", "addresses": ["0", "1", "2"]}
