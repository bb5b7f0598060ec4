"""Torch code as written for torchrun / TorchDistributor runs unchanged: torchrun's
rank environment, real PyTorch Lightning through `sparkdist run` and through
`sparkdist.TorchDistributor`, under both launchers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sparkdist import HorovodRunner

pytest.importorskip("pytorch_lightning")

SCRIPTS = Path(__file__).parent / "scripts"
LIGHTNING = SCRIPTS / "lightning_fit.py"
VENV_BIN = Path(sys.executable).parent

TORCHRUN_VARS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TP_SOCKET_IFNAME",
)  # fmt: skip


def torchrun_view():
    import os

    import torch.distributed as dist
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def body():
        env = {k: os.environ.get(k) for k in TORCHRUN_VARS}
        dist.init_process_group("gloo")
        env["launched"] = dist.is_torchelastic_launched()
        env["dist_world"] = dist.get_world_size()
        dist.destroy_process_group()
        return env

    return body()


@pytest.mark.parametrize("launcher", ["direct", "mpi"])
def test_torchrun_environment(sc, launcher):
    runner = HorovodRunner(np=2, launcher=launcher, timeout=120)
    views = runner.run_all(torchrun_view)
    assert [v["RANK"] for v in views] == ["0", "1"]
    assert {v["TORCHELASTIC_RUN_ID"] for v in views} == {runner.last_job.job_id}
    for rank, view in enumerate(views):
        # One Spark task is one torchrun "node" (group): two executors on one host
        # are two nodes, each with local rank 0.
        assert view["GROUP_RANK"] == str(rank) and view["GROUP_WORLD_SIZE"] == "2"
        assert view["LOCAL_RANK"] == "0" and view["LOCAL_WORLD_SIZE"] == "1"
        assert view["ROLE_RANK"] == str(rank) and view["ROLE_WORLD_SIZE"] == "2"
        assert view["WORLD_SIZE"] == "2" and view["ROLE_NAME"] == "default"
        assert view["TORCHELASTIC_USE_AGENT_STORE"] == "False"
        assert view["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert view["TP_SOCKET_IFNAME"] == "lo"
        assert view["launched"] is True and view["dist_world"] == 2


def _check_lightning(out: Path) -> None:
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert {r["env"] for r in ranks} == {"TorchElasticEnvironment"}
    assert ranks[0]["weights"] == ranks[1]["weights"]


@pytest.mark.parametrize("launcher", ["direct", "mpi"])
def test_lightning_script_through_sparkdist_run(sc, tmp_path, launcher):
    import os

    env = dict(os.environ)
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    env.update(PYSPARK_DRIVER_PYTHON=sys.executable)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env['PATH']}"
    done = subprocess.run(
        [VENV_BIN / "sparkdist", "run", "--np", "2", "--launcher", launcher, str(LIGHTNING),
         "--", "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    _check_lightning(tmp_path)


@pytest.mark.parametrize("launcher", ["direct", "mpi"])
def test_lightning_function_through_torch_distributor(sc, tmp_path, launcher):
    import cloudpickle

    from sparkdist import TorchDistributor

    sys.path.insert(0, str(SCRIPTS))
    try:
        import lightning_fit
    finally:
        sys.path.remove(str(SCRIPTS))
    cloudpickle.register_pickle_by_value(lightning_fit)
    try:
        result = TorchDistributor(2, local_mode=False, use_gpu=False, launcher=launcher).run(
            lightning_fit.fit, str(tmp_path), epochs=2
        )
    finally:
        cloudpickle.unregister_pickle_by_value(lightning_fit)
    assert result["rank"] == 0 and result["world_size"] == 2
    _check_lightning(tmp_path)
