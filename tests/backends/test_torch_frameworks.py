"""Torch code as written for torchrun / pyspark's TorchDistributor runs unchanged:
torchrun's rank environment; `sparkdist.TorchDistributor` against pyspark's own on the
same session (same errors, same trained weights), on the cluster and on the driver, for
functions and scripts, with Spark's GPUs; DeepSpeed ZeRO through
`sparkdist.DeepspeedTorchDistributor`; real PyTorch Lightning through `sparkdist run` and
through `sparkdist.TorchDistributor` (under both launchers)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fake_gpus import run_with_fake_gpus

from sparkdist import DeepspeedTorchDistributor, HorovodRunner, TorchDistributor

# Not `pytest.importorskip` at the top: a rank that runs a function of this module (pickled
# by reference) imports the module, and Lightning costs it about 6 CPU seconds.
needs_lightning = pytest.mark.skipif(
    importlib.util.find_spec("pytorch_lightning") is None, reason="needs pytorch_lightning"
)

SCRIPTS = Path(__file__).parents[1] / "scripts"
LIGHTNING = SCRIPTS / "lightning_fit.py"
DDP = SCRIPTS / "ddp_fit.py"
DEEPSPEED = SCRIPTS / "deepspeed_fit.py"
VENV_BIN = Path(sys.executable).parent


@contextlib.contextmanager
def script_module(name: str):
    """Import tests/scripts/NAME as a module whose functions travel by value (the
    executors cannot import it), for sparkdist's cloudpickle and pyspark's own copy."""
    import cloudpickle
    from pyspark import cloudpickle as pyspark_cloudpickle

    sys.path.insert(0, str(SCRIPTS))
    try:
        module = importlib.import_module(name)
    finally:
        sys.path.remove(str(SCRIPTS))
    for pickler in (cloudpickle, pyspark_cloudpickle):
        pickler.register_pickle_by_value(module)
    try:
        yield module
    finally:
        for pickler in (cloudpickle, pyspark_cloudpickle):
            pickler.unregister_pickle_by_value(module)


TORCHRUN_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TP_SOCKET_IFNAME",
)


def torchrun_view():
    import torch.distributed as dist
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def body():
        env = {k: os.environ.get(k) for k in TORCHRUN_VARS}
        dist.init_process_group("gloo")
        env["launched"] = dist.is_torchelastic_launched()
        env["dist_world"] = dist.get_world_size()
        # Both ranks past gloo's connectFullMesh before either closes its pairs: a rank that
        # tears its group down at once can fail its peer's handshake ("Connection closed by
        # peer"), seen once the ranks stopped importing Lightning with this module.
        dist.barrier()
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


# --- sparkdist.TorchDistributor against pyspark's ---------------------------------------


def _pyspark_error(cls, *args, **kwargs) -> tuple[type, str]:
    with pytest.raises(Exception) as caught:
        cls(*args, **kwargs)
    return type(caught.value), str(caught.value)


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((0,), {"use_gpu": False}),
        ((-1,), {"local_mode": False, "use_gpu": False}),
        ((2,), {"local_mode": False, "use_gpu": True}),  # no spark.task.resource.gpu.amount
        ((2,), {"local_mode": True, "use_gpu": True}),  # the driver has no GPUs
    ],
)
def test_constructor_errors_are_pyspark_s(spark, args, kwargs):
    from pyspark.ml.deepspeed.deepspeed_distributor import (
        DeepspeedTorchDistributor as PysparkDeepspeed,
    )
    from pyspark.ml.torch.distributor import TorchDistributor as PysparkTorch

    expected = _pyspark_error(PysparkTorch, *args, **kwargs)
    assert _pyspark_error(TorchDistributor, *args, **kwargs) == expected
    ds_kwargs = {"localMode": kwargs.get("local_mode", True), "useGpu": kwargs["use_gpu"]}
    expected = _pyspark_error(PysparkDeepspeed, *args, **ds_kwargs)
    assert _pyspark_error(DeepspeedTorchDistributor, *args, **ds_kwargs) == expected


def test_bad_train_objects_fail_before_the_job(spark, tmp_path):
    from pyspark.ml.torch.distributor import TorchDistributor as PysparkTorch

    distributor = TorchDistributor(2, local_mode=False, use_gpu=False)
    with pytest.raises(TypeError, match="train_object must be a function .* or the path"):
        distributor.run(42)
    with pytest.raises(FileNotFoundError, match="training script not found"):
        distributor.run(str(tmp_path / "missing.py"))
    pyspark_message = "Running pytorch file does not support key-word type arguments."
    with pytest.raises(ValueError, match=pyspark_message):
        PysparkTorch._run_training_on_pytorch_file({}, str(DDP), steps=1)
    with pytest.raises(ValueError, match=pyspark_message):
        distributor.run(str(DDP), steps=1)
    with pytest.raises(ValueError, match="keyword arguments"):
        DeepspeedTorchDistributor(2, localMode=False, useGpu=False).run(str(DDP), steps=1)
    with pytest.raises(ValueError, match="max_failures must be an int >= 0"):
        TorchDistributor(2, local_mode=False, use_gpu=False, max_failures=-1)


@pytest.fixture(scope="module")
def ddp_reference():
    """`ddp_fit.train(3, lr=0.1)` on 2 ranks without DDP: one process, the mean of both
    ranks' losses (DDP averages the gradients of equal batches)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    xs = [torch.randn(16, 4, generator=torch.Generator().manual_seed(r + 1)) for r in (0, 1)]
    for _ in range(3):
        optimizer.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)) for x in xs)
        (loss / 2).backward()
        optimizer.step()
    return [p.detach().flatten().tolist() for p in model.parameters()]


def _assert_weights(weights, expected):
    assert sum(weights, []) == pytest.approx(sum(expected, []), rel=1e-5, abs=1e-6)


def test_same_result_as_pyspark_torch_distributor(spark, ddp_reference):
    from pyspark.ml.torch.distributor import TorchDistributor as PysparkTorch

    with script_module("ddp_fit") as ddp_fit:
        theirs = PysparkTorch(2, local_mode=False, use_gpu=False).run(ddp_fit.train, 3, lr=0.1)
        ours = TorchDistributor(2, local_mode=False, use_gpu=False).run(ddp_fit.train, 3, lr=0.1)
    for result in (theirs, ours):
        assert (result["rank"], result["world_size"]) == (0, 2)
        assert result["cuda_visible_devices"] == ""  # use_gpu=False hides the GPUs
    assert ours["weights"] == theirs["weights"]
    _assert_weights(ours["weights"], ddp_reference)
    assert ours["cwd"] != os.getcwd()  # ran in an executor


def test_local_mode_function_and_script(spark, tmp_path, ddp_reference):
    with script_module("ddp_fit") as ddp_fit:
        local = TorchDistributor(2, local_mode=True, use_gpu=False).run(ddp_fit.train, 3, lr=0.1)
    assert (local["rank"], local["world_size"], local["cwd"]) == (0, 2, os.getcwd())
    _assert_weights(local["weights"], ddp_reference)

    # A script: arguments become strings, as under pyspark; nothing comes back.
    distributor = TorchDistributor(2, local_mode=False, use_gpu=False)
    assert distributor.run(str(DDP), "--steps", 3, "--lr", 0.1, "--out", tmp_path) is None
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["world_size"]) for r in ranks] == [(0, 2), (1, 2)]
    assert ranks[0]["weights"] == ranks[1]["weights"]
    _assert_weights(ranks[0]["weights"], ddp_reference)


FAKE_GPU_CHILD = textwrap.dedent(
    """
    import json, os, sys, tempfile
    from pyspark.sql import SparkSession
    from pyspark.ml.torch.distributor import TorchDistributor as PysparkTorch
    from sparkdist import HorovodRunner, NotEnoughSlotsError, TorchDistributor

    fake = sys.argv[1]


    def session(master, gpus):
        builder = (
            SparkSession.builder.master(master)
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.executor.memory", "512m")
            .config("spark.worker.resource.gpu.discoveryScript", fake)
        )
        for key, value in gpus.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        return spark


    def devices(out):
        # Each rank's GPUs into a file of its own (the tasks run on this host): no torch
        # import and process group a rank just to gather a string; the layout with two
        # GPUs a task below all-reduces through gloo.
        import os

        import json

        with open(os.path.join(out, os.environ["RANK"]), "w") as f:
            json.dump(os.environ.get("CUDA_VISIBLE_DEVICES"), f)


    def devices_of(distributor):
        # `devices` through `distributor`: each rank's CUDA_VISIBLE_DEVICES, by rank.
        out = tempfile.mkdtemp(dir=os.getcwd())
        distributor.run(devices, out)
        ranks = sorted(os.listdir(out), key=int)
        assert ranks == [str(r) for r in range(len(ranks))], ranks
        return [json.load(open(os.path.join(out, rank))) for rank in ranks]


    def one_gpu_per_task():
        spark = session(
            "local-cluster[1,2,1024]",
            {
                "spark.worker.resource.gpu.amount": "2",
                "spark.executor.resource.gpu.amount": "2",
                "spark.task.resource.gpu.amount": "1",
                "spark.driver.resource.gpu.amount": "2",
                "spark.driver.resource.gpu.discoveryScript": fake,
            },
        )
        out = {
            "pyspark cluster": devices_of(PysparkTorch(2, local_mode=False, use_gpu=True)),
            "cluster": devices_of(TorchDistributor(2, local_mode=False, use_gpu=True)),
            "pyspark driver": devices_of(PysparkTorch(2, local_mode=True, use_gpu=True)),
            "driver": devices_of(TorchDistributor(2, local_mode=True, use_gpu=True)),
            "cluster, no gpu": devices_of(TorchDistributor(2, local_mode=False, use_gpu=False)),
        }
        # More ranks than the driver's GPUs: pyspark lowers num_processes to their number.
        out["driver, 3 ranks"] = [
            cls(3, local_mode=True, use_gpu=True).num_processes
            for cls in (PysparkTorch, TorchDistributor)
        ]
        spark.stop()
        return out


    def place():
        import os
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        ranks = torch.tensor([int(os.environ["RANK"])])
        dist.all_reduce(ranks)
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "GROUP_WORLD_SIZE", "CUDA_VISIBLE_DEVICES")
        mine = {k: os.environ.get(k) for k in keys}
        mine["rank_sum"] = int(ranks.item())
        seen = [None] * dist.get_world_size()
        dist.all_gather_object(seen, mine)
        dist.destroy_process_group()
        return seen


    def two_gpus_per_task():
        spark = session(
            "local-cluster[2,2,1024]",
            {
                "spark.worker.resource.gpu.amount": "2",
                "spark.executor.resource.gpu.amount": "2",
                "spark.task.resource.gpu.amount": "2",
            },
        )
        out = {"pyspark": PysparkTorch(4, local_mode=False, use_gpu=True).run(place)}
        for launcher in ("direct", "mpi"):
            ours = TorchDistributor(4, local_mode=False, use_gpu=True, launcher=launcher)
            out[launcher] = ours.run(place)
            runner = ours._runner()
            out[launcher + " tasks"] = runner.options.ranks_per_task
        try:
            HorovodRunner(np=6, ranks_per_task=2, start_timeout=5).run(place)
        except NotEnoughSlotsError as exc:
            out["slots"] = str(exc)
        spark.stop()
        return out


    # One process, one driver JVM, two Spark applications in turn (each stopped before
    # the next starts): their configurations cannot share one SparkContext.
    out = {"one gpu per task": one_gpu_per_task(), "two gpus per task": two_gpus_per_task()}
    print("RESULT " + json.dumps(out), flush=True)
    """
)


@pytest.fixture(scope="module")
def fake_gpu_runs(tmp_path_factory):
    """Both GPU layouts' runs, from one child process (its own Spark with fake GPUs): the
    process, its imports and its driver JVM start once for the two tests below."""
    return run_with_fake_gpus(FAKE_GPU_CHILD, tmp_path_factory.mktemp("fake-gpus"))


def test_gpus_from_spark_task_resources(fake_gpu_runs):
    out = fake_gpu_runs["one gpu per task"]
    # One Spark GPU per task, as pyspark's distributor gives them.
    assert sorted(out["cluster"]) == sorted(out["pyspark cluster"]) == ["0", "1"]
    # On the driver every rank sees the driver's GPUs, as torchrun's processes do
    # (pyspark lists them in no fixed order).
    for seen in (out["driver"], out["pyspark driver"]):
        assert [sorted(gpus.split(",")) for gpus in seen] == [["0", "1"]] * 2
    assert out["cluster, no gpu"] == ["", ""]
    assert out["driver, 3 ranks"] == [2, 2]


def test_two_gpus_per_task_run_two_ranks_per_task(fake_gpu_runs):
    """spark.task.resource.gpu.amount=2: pyspark's TorchDistributor runs 4 processes as
    2 tasks of 2 (torchrun's nproc_per_node=2); so does sparkdist's, under both
    launchers, with the same rank layout and GPUs."""
    out = fake_gpu_runs["two gpus per task"]
    expected = [
        {
            "RANK": str(rank),
            "WORLD_SIZE": "4",
            "LOCAL_RANK": str(rank % 2),
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": str(rank // 2),
            "GROUP_WORLD_SIZE": "2",
            "CUDA_VISIBLE_DEVICES": "0,1",
            "rank_sum": 6,
        }
        for rank in range(4)
    ]

    def gpus_as_sets(views):  # Spark lists a task's GPU addresses in no fixed order
        return [
            {**v, "CUDA_VISIBLE_DEVICES": set(v["CUDA_VISIBLE_DEVICES"].split(","))} for v in views
        ]

    expected = gpus_as_sets(expected)
    assert gpus_as_sets(out["pyspark"]) == expected
    assert gpus_as_sets(out["direct"]) == gpus_as_sets(out["mpi"]) == expected
    assert out["direct tasks"] == out["mpi tasks"] == 2
    assert "np=6 ranks (2 per task) need 3 task slots" in out["slots"]
    assert "has 2 task slots" in out["slots"]


# --- DeepSpeed ------------------------------------------------------------------------


def _deepspeed_config(stage: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 32,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,  # SGD from torch, not DeepSpeed's own
    }


@pytest.mark.parametrize("stage", [1, 2])
def test_deepspeed_zero_through_deepspeed_torch_distributor(spark, tmp_path, stage):
    pytest.importorskip("deepspeed")
    if stage == 1:  # a script, the config a dict
        distributor = DeepspeedTorchDistributor(
            numGpus=1,
            nnodes=2,
            localMode=False,
            useGpu=False,
            deepspeedConfig=_deepspeed_config(stage),
        )
        assert distributor.run(str(DEEPSPEED), tmp_path) is None
    else:  # a function, the config a file
        config = tmp_path / "ds_config.json"
        config.write_text(json.dumps(_deepspeed_config(stage)))
        distributor = DeepspeedTorchDistributor(
            numGpus=1, nnodes=2, localMode=False, useGpu=False, deepspeedConfig=str(config)
        )
        with script_module("deepspeed_fit") as deepspeed_fit:
            assert distributor.run(deepspeed_fit.fit, str(tmp_path))["rank"] == 0
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    for rank, result in enumerate(ranks):
        assert (result["rank"], result["world_size"]) == (rank, 2)
        assert result["zero_stage"] == stage and result["backend"] == "gloo"
        assert result["config"].endswith(".json")
        assert result["losses"] == sorted(result["losses"], reverse=True)  # it learns
        assert result["losses"][-1] < result["losses"][0] / 2
    assert ranks[0]["weights"] == ranks[1]["weights"]
    assert ranks[0]["losses"] != ranks[1]["losses"]  # each rank had its own data


# --- Lightning ------------------------------------------------------------------------


def _check_lightning(out: Path) -> None:
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert {r["env"] for r in ranks} == {"TorchElasticEnvironment"}
    assert ranks[0]["weights"] == ranks[1]["weights"]


@needs_lightning
def test_lightning_script_through_sparkdist_run(sc, tmp_path):
    """A Lightning script through the `sparkdist run` command (its own Spark, started by
    the command), under the direct launcher. Lightning under mpi is
    test_lightning_function_through_torch_distributor[mpi]; a script through `sparkdist
    run` under mpi (the default launcher) is test_scripts_cli.test_sparkdist_run_command."""
    env = dict(os.environ)
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    env.update(PYSPARK_DRIVER_PYTHON=sys.executable)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env['PATH']}"
    done = subprocess.run(
        [
            VENV_BIN / "sparkdist",
            "run",
            "--np",
            "2",
            "--launcher",
            "direct",
            str(LIGHTNING),
            "--",
            "--out",
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    _check_lightning(tmp_path)


@needs_lightning
@pytest.mark.parametrize("launcher", ["direct", "mpi"])
def test_lightning_function_through_torch_distributor(sc, tmp_path, launcher):
    with script_module("lightning_fit") as lightning_fit:
        result = TorchDistributor(2, local_mode=False, use_gpu=False, launcher=launcher).run(
            lightning_fit.fit, str(tmp_path), epochs=2
        )
    assert result["rank"] == 0 and result["world_size"] == 2
    _check_lightning(tmp_path)
