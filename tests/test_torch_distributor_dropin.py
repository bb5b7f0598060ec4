"""What pyspark's own suites check of its distributors holds for ours.

pyspark's `python/pyspark/ml/torch/tests/test_distributor.py` and
`python/pyspark/ml/deepspeed/tests/test_deepspeed_distributor.py` check, through
`TorchDistributor` / `DeepspeedTorchDistributor`: the constructor's inputs and errors
(`input_params`, `num_processes`, `num_tasks`, the GPU configuration), the refusal on a
cluster that asks for encryption, a script's command line and output, the environment
and GPUs a rank sees, the end-to-end training of a function and of a script on the
driver and on the cluster, and DeepSpeed's config flags. These are our own tests of
those public behaviours (their private helpers are tested through what they do), with
real Spark and real ranks; GPUs are faked with a discovery script, as Spark's tests
fake them. Deliberate differences are in docs/migration.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import textwrap
from pathlib import Path

import pytest
from fake_gpus import run_with_fake_gpus

from sparkdist import DeepspeedTorchDistributor, TorchDistributor

# --- the constructor ----------------------------------------------------------------


@pytest.mark.parametrize("num_processes", [1, 100])
@pytest.mark.parametrize("local_mode", [True, False])
def test_input_params_hold_the_inputs(spark, num_processes, local_mode):
    distributor = TorchDistributor(num_processes, local_mode, False)
    assert distributor.input_params == {
        "num_processes": num_processes,
        "local_mode": local_mode,
        "use_gpu": False,
        "num_tasks": num_processes,
    }
    assert distributor.num_tasks == num_processes


def test_deepspeed_input_params_add_the_config(spark):
    config = {"train_micro_batch_size_per_gpu": 4}
    distributor = DeepspeedTorchDistributor(
        numGpus=2, nnodes=3, localMode=False, useGpu=False, deepspeedConfig=config
    )
    assert distributor.input_params == {
        "num_processes": 6,
        "local_mode": False,
        "use_gpu": False,
        "num_tasks": 6,
        "deepspeed_config": config,
    }
    # A bool is an int: pyspark's suite runs numGpus=True as one process.
    assert DeepspeedTorchDistributor(numGpus=True, useGpu=False).num_processes == 1


@pytest.mark.parametrize("num_processes", [0, -1])
@pytest.mark.parametrize("local_mode", [True, False])
def test_non_positive_num_processes_is_refused(spark, num_processes, local_mode):
    with pytest.raises(ValueError, match="num_processes has to be a positive integer"):
        TorchDistributor(num_processes, local_mode, False)


@pytest.mark.parametrize("num_processes", [1, 4, 5])
def test_gpus_asked_but_not_configured(spark, num_processes):
    """The shared session has no GPU resources."""
    with pytest.raises(RuntimeError, match="GPUs were unable to be found on the driver"):
        TorchDistributor(num_processes, True, True)
    with pytest.raises(RuntimeError, match="'spark.task.resource.gpu.amount' was unset"):
        TorchDistributor(num_processes, False, True)


# --- encryption ---------------------------------------------------------------------


@contextlib.contextmanager
def spark_conf(spark, **settings: str):
    """Runtime settings (dots spelled as '__'), unset afterwards."""
    keys = {k.replace("__", "."): v for k, v in settings.items()}
    for key, value in keys.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key in keys:
            spark.conf.unset(key)


def _rank():
    import os

    return int(os.environ["RANK"])


def test_a_cluster_that_asks_for_encryption_is_refused(spark):
    with spark_conf(spark, spark__ssl__enabled="true"):
        with pytest.raises(RuntimeError, match="encryption") as refused:
            TorchDistributor(1, False, False).run(_rank)
        assert "'pytorch.spark.distributor.ignoreSsl'" in str(refused.value)
        with pytest.raises(RuntimeError, match="'deepspeed.spark.distributor.ignoreSsl'"):
            DeepspeedTorchDistributor(1, localMode=False, useGpu=False).run(_rank)
        # On the driver nothing crosses the network: pyspark runs it.
        assert TorchDistributor(1, True, False).run(_rank) == 0


def test_encryption_refusal_can_be_overridden(spark, caplog):
    settings = {"spark__ssl__enabled": "true", "pytorch__spark__distributor__ignoreSsl": "true"}
    with spark_conf(spark, **settings), caplog.at_level(logging.WARNING, "TorchDistributor"):
        assert TorchDistributor(1, False, False).run(_rank) == 0
    assert any("does not support data encryption" in r.message for r in caplog.records)
    with spark_conf(spark, spark__ssl__enabled="false"):
        assert TorchDistributor(1, False, False).run(_rank) == 0


# --- scripts: command line, environment, output -------------------------------------

RANK_VIEW = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
)

TRAIN_SCRIPT = textwrap.dedent(
    f"""
    import argparse, json, os, sys
    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser()
    parser.add_argument("lr", help="learning rate")
    parser.add_argument("out")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=float(args.lr))
    x = torch.randn(32, 4)
    for _ in range(3):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        optimizer.step()
    view = {{k: os.environ.get(k) for k in {RANK_VIEW!r}}}
    view["argv"] = sys.argv[1:]
    view["weights"] = [p.detach().flatten().tolist() for p in model.parameters()]
    with open(os.path.join(args.out, "rank-%d.json" % dist.get_rank()), "w") as f:
        json.dump(view, f)
    dist.destroy_process_group()
    """
)


def _views(out: Path, world: int) -> list[dict]:
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(world)]


@pytest.mark.parametrize("local_mode", [True, False])
def test_script_runs_with_its_arguments_as_strings(spark, tmp_path, local_mode):
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()

    assert TorchDistributor(2, local_mode, False).run(str(script), 0.01, out) is None

    views = _views(out, 2)
    assert [v["argv"] for v in views] == [["0.01", str(out)]] * 2
    assert views[0]["weights"] == views[1]["weights"]  # DDP kept them in step
    for rank, view in enumerate(views):
        assert (view["RANK"], view["WORLD_SIZE"]) == (str(rank), "2")
        assert view["MASTER_ADDR"] and view["MASTER_PORT"]
        if local_mode:  # torchrun --standalone --nnodes=1 --nproc_per_node=2
            assert (view["LOCAL_RANK"], view["LOCAL_WORLD_SIZE"]) == (str(rank), "2")
            assert (view["GROUP_RANK"], view["GROUP_WORLD_SIZE"]) == ("0", "1")
        else:  # one task a node: --nnodes=2 --node_rank=<task> --nproc_per_node=1
            assert (view["LOCAL_RANK"], view["LOCAL_WORLD_SIZE"]) == ("0", "1")
            assert (view["GROUP_RANK"], view["GROUP_WORLD_SIZE"]) == (str(rank), "2")
            assert view["CUDA_VISIBLE_DEVICES"] == ""  # use_gpu=False hides the GPUs


def test_script_output_reaches_the_driver_and_its_failure_raises(spark, tmp_path, capsys):
    script = tmp_path / "noisy.py"
    script.write_text(
        "import sys\n"
        "print('hello_stdout', flush=True)\n"
        "print('hello_stderr', file=sys.stderr, flush=True)\n"
        "print('abc' 'def', flush=True)\n"
        "sys.exit(int(sys.argv[1]))\n"
    )
    assert TorchDistributor(1, True, False).run(str(script), 0) is None
    captured = capsys.readouterr()
    assert "hello_stdout" in captured.out
    assert "hello_stderr" in captured.err  # pyspark merges it into stdout

    with pytest.raises(RuntimeError) as failed:
        TorchDistributor(1, True, False).run(str(script), 1)
    message = str(failed.value)
    assert "abcdef" in message and "exit code 1" in message


# --- functions: end to end ----------------------------------------------------------


def create_training_function(rows: int):
    """As pyspark's suite builds one: the data and the model's class are made on the
    driver and travel in the function's closure."""
    import torch

    features = torch.randn(rows, 4, generator=torch.Generator().manual_seed(0))
    labels = features.sum(1, keepdim=True)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 1)

        def forward(self, x):
            return self.fc(x)

    def train_fn(learning_rate: float, epochs: int = 1):
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817
        from torch.utils.data import DataLoader, TensorDataset
        from torch.utils.data.distributed import DistributedSampler

        dist.init_process_group("gloo")
        dataset = TensorDataset(features, labels)
        loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset))
        model = DDP(Net())
        optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate, momentum=0.5)
        for _ in range(epochs):
            for x, y in loader:
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
        dist.destroy_process_group()
        return "success"

    return train_fn


@pytest.mark.parametrize("local_mode", [True, False])
def test_function_end_to_end(spark, local_mode):
    train_fn = create_training_function(64)
    distributor = TorchDistributor(num_processes=2, local_mode=local_mode, use_gpu=False)
    assert distributor.run(train_fn, 0.001) == "success"
    assert distributor.run(train_fn, 0.001, epochs=2) == "success"


# --- DeepSpeed ----------------------------------------------------------------------

ARGV_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    args = sys.argv[1:]
    config = None
    if "--deepspeed_config" in args:
        with open(args[args.index("--deepspeed_config") + 1]) as f:
            config = json.load(f)
    with open(os.path.join(sys.argv[1], "rank-%s.json" % os.environ["RANK"]), "w") as f:
        json.dump({"argv": args, "config": config}, f)
    """
)


def _argv_and_config(out: str) -> dict:
    import json
    import os
    import sys

    args = sys.argv[1:]
    config = None
    if "--deepspeed_config" in args:
        with open(args[args.index("--deepspeed_config") + 1]) as f:
            config = json.load(f)
    view = {"argv": args, "config": config}
    with open(os.path.join(out, f"rank-{os.environ['RANK']}.json"), "w") as f:
        json.dump(view, f)
    return view


@pytest.mark.parametrize("local_mode", [True, False])
def test_deepspeed_flags_follow_the_script_s_arguments(spark, tmp_path, local_mode):
    script = tmp_path / "ds_train.py"
    script.write_text(ARGV_SCRIPT)
    config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 1}}
    config_file = tmp_path / "ds_config.json"
    config_file.write_text(json.dumps(config))
    out = tmp_path / "out"
    out.mkdir()

    def run(deepspeed_config, *args):
        distributor = DeepspeedTorchDistributor(
            numGpus=2, localMode=local_mode, useGpu=False, deepspeedConfig=deepspeed_config
        )
        assert distributor.run(str(script), out, *args) is None
        return _views(out, 2)

    # No config: DeepSpeed's defaults, only --deepspeed.
    assert [v["argv"] for v in run(None, 1)] == [[str(out), "1", "--deepspeed"]] * 2
    # A path the ranks see: passed as it is.
    expected = [str(out), "--deepspeed", "--deepspeed_config", str(config_file)]
    assert [v["argv"] for v in run(str(config_file))] == [expected] * 2
    # A dict: written to a JSON file on each rank.
    for view in run(config, "--arg1"):
        assert view["argv"][:4] == [str(out), "--arg1", "--deepspeed", "--deepspeed_config"]
        assert view["argv"][4].endswith(".json") and view["config"] == config


def test_deepspeed_function_sees_the_flags_in_sys_argv(spark, tmp_path):
    config = {"train_micro_batch_size_per_gpu": 2}
    distributor = DeepspeedTorchDistributor(
        numGpus=1, nnodes=2, localMode=False, useGpu=False, deepspeedConfig=config
    )
    view = distributor.run(_argv_and_config, str(tmp_path))
    assert view["argv"][:2] == ["--deepspeed", "--deepspeed_config"]
    assert view["config"] == config


def pythagoras(leg1: float, leg2: float) -> float:
    import deepspeed

    print(deepspeed.__version__)
    return (leg1 * leg1 + leg2 * leg2) ** 0.5


PYTHAGORAS_SCRIPT = textwrap.dedent(
    """
    import sys

    def pythagorean_thm(x, y):
        import deepspeed
        return (x * x + y * y) ** 0.5

    print("hypotenuse", pythagorean_thm(int(sys.argv[1]), int(sys.argv[2])))
    """
)


@pytest.mark.parametrize("local_mode", [True, False])
def test_deepspeed_end_to_end(spark, tmp_path, capsys, local_mode):
    pytest.importorskip("deepspeed")
    distributor = DeepspeedTorchDistributor(numGpus=2, useGpu=False, localMode=local_mode)
    assert distributor.run(pythagoras, 3, 4) == 5

    script = tmp_path / "pythagoras.py"
    script.write_text(PYTHAGORAS_SCRIPT)
    single = DeepspeedTorchDistributor(numGpus=True, useGpu=False, localMode=local_mode)
    assert single.run(str(script), 2, 5) is None
    assert "hypotenuse 5.385" in capsys.readouterr().out


# --- GPUs, from Spark's GPU resources (faked) ----------------------------------------

GPU_CHILD = textwrap.dedent(
    """
    import json, logging, os, sys
    from pyspark.sql import SparkSession
    from sparkdist import TorchDistributor

    fake = sys.argv[1]
    os.environ["SPARKDIST_FAKE_GPUS"] = "0,1,2"
    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executor.memory", "512m")
        # The driver has three GPUs; each worker three, each executor and task one.
        .config("spark.driver.resource.gpu.amount", "3")
        .config("spark.driver.resource.gpu.discoveryScript", fake)
        .config("spark.worker.resource.gpu.amount", "3")
        .config("spark.worker.resource.gpu.discoveryScript", fake)
        .config("spark.executor.resource.gpu.amount", "1")
        .config("spark.task.resource.gpu.amount", "1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    out = {}

    # More processes than the driver's GPUs: one warning, num_processes lowered.
    class Records(logging.Handler):
        def __init__(self):
            super().__init__(logging.WARNING)
            self.records = []

        def emit(self, record):
            self.records.append(record.getMessage())

    records = Records()
    logging.getLogger("TorchDistributor").addHandler(records)
    out["local sizes"] = {}
    for n in (1, 2, 4, 8):
        d = TorchDistributor(n, True, True)
        out["local sizes"][n] = [d.num_processes, d.input_params["num_processes"], d.num_tasks]
    out["warnings"] = records.records

    def devices():
        import os
        return os.environ.get("CUDA_VISIBLE_DEVICES", "NONE")

    # The GPUs a rank sees on the driver, under the driver's CUDA_VISIBLE_DEVICES.
    out["local"] = []
    for visible, n, use_gpu in [("0,1,2", 1, True), ("0,1,2", 3, True), ("3,4,5", 2, True),
                                ("0,1,2", 2, False), (None, 3, False)]:
        if visible is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
        seen = TorchDistributor(n, True, use_gpu).run(devices)
        out["local"].append([visible, n, use_gpu, seen, os.environ.get("CUDA_VISIBLE_DEVICES")])
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)

    # On the cluster: the task's one GPU.
    out["cluster"] = TorchDistributor(2, False, True).run(devices)

    # Tasks per spark.task.resource.gpu.amount.
    out["tasks"] = []
    for amount, n in [(1, 8), (2, 8), (3, 9), (3, 8)]:
        spark.conf.set("spark.task.resource.gpu.amount", str(amount))
        try:
            out["tasks"].append([amount, n, TorchDistributor(n, False, True).input_params])
        except RuntimeError as exc:
            out["tasks"].append([amount, n, str(exc)])
    print("RESULT " + json.dumps(out), flush=True)
    spark.stop()
    """
)


def test_gpus_from_spark_resources(tmp_path):
    out = run_with_fake_gpus(GPU_CHILD, tmp_path)

    # 1 and 2 processes fit the driver's 3 GPUs; 4 and 8 are lowered to 3, with one
    # warning each on pyspark's logger name.
    assert out["local sizes"] == {"1": [1, 1, 1], "2": [2, 2, 2], "4": [3, 3, 3], "8": [3, 3, 3]}
    assert len(out["warnings"]) == 2
    assert all("'num_processes' was reset" in w for w in out["warnings"])

    local = {(v, n, use_gpu): (seen, after) for v, n, use_gpu, seen, after in out["local"]}
    # use_gpu: num_processes of the driver's GPUs, named through its CUDA_VISIBLE_DEVICES.
    seen, after = local[("0,1,2", 1, True)]
    assert len(seen.split(",")) == 1 and seen in {"0", "1", "2"} and after == "0,1,2"
    assert sorted(local[("0,1,2", 3, True)][0].split(",")) == ["0", "1", "2"]
    seen = local[("3,4,5", 2, True)][0].split(",")
    assert len(set(seen)) == 2 and set(seen) <= {"3", "4", "5"}
    # Without use_gpu the ranks see the driver's own setting, or none.
    assert local[("0,1,2", 2, False)] == ("0,1,2", "0,1,2")
    assert local[(None, 3, False)] == ("NONE", None)

    assert out["cluster"] in ("0", "1", "2")  # one GPU: its task's

    tasks = {(amount, n): params for amount, n, params in out["tasks"]}
    assert tasks[(1, 8)]["num_tasks"] == 8
    assert tasks[(2, 8)]["num_tasks"] == 4
    assert tasks[(3, 9)]["num_tasks"] == 3
    assert "must be a multiple of 'spark.task.resource.gpu.amount' (3)" in tasks[(3, 8)]
