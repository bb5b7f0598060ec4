"""Every notebook runs end to end on local Spark, as it would on Databricks, and does what
it says: accuracies reached, checkpoints and models written, plots saved as PNG."""

from __future__ import annotations

import json
import re
import runpy
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_notebook(name: str, spark, output_dir: Path) -> dict:
    """Run a notebook the way Databricks would (its cells in order, `spark` defined)."""
    path = NOTEBOOKS / name
    check_source_format(path)
    # As `__main__`, like a notebook: its functions are pickled by value for the ranks.
    return runpy.run_path(
        str(path),
        init_globals={"spark": spark, "OUTPUT_DIR": str(output_dir)},
        run_name="__main__",
    )


def check_source_format(path: Path) -> None:
    """Databricks' source format: the header, cells split by COMMAND lines, and markdown
    cells made only of `# MAGIC` lines that start with %md."""
    text = path.read_text()
    assert text.startswith("# Databricks notebook source\n"), path
    cells = text[len("# Databricks notebook source\n") :].split("\n# COMMAND ----------\n")
    assert len(cells) >= 4, path
    for cell in cells:
        lines = [line for line in cell.strip("\n").splitlines()]
        assert lines, f"empty cell in {path.name}"
        if lines[0].startswith("# MAGIC"):
            assert lines[0] == "# MAGIC %md" or lines[0].startswith("# MAGIC %md "), lines[0]
            assert all(line.startswith("# MAGIC") for line in lines), cell


def test_notebooks_are_all_tested():
    tested = {
        "01_pytorch_single_node_to_distributed.py",
        "02_tensorflow_keras_multiworker.py",
        "03_partition_ensembles.py",
        "04_horovod_timeline.py",
        "05_hyperparameter_search.py",
        "06_torch_frameworks.py",
        "07_parameter_servers.py",
    }
    assert {p.name for p in NOTEBOOKS.glob("*.py")} == tested


@pytest.mark.horovod
def test_01_pytorch_single_node_to_distributed(spark, tmp_path, capfd):
    ns = run_notebook("01_pytorch_single_node_to_distributed.py", spark, tmp_path)
    assert ns["single_accuracy"] >= 0.92
    assert ns["driver_result"]["size"] == 2
    assert ns["driver_result"]["accuracy"] >= 0.85
    assert ns["hvd_result"]["size"] == 2 and ns["hvd_result"]["accuracy"] >= 0.92
    assert ns["ddp_result"]["size"] == 2 and ns["ddp_result"]["accuracy"] >= 0.92
    # Only rank 0 checkpointed: one file per epoch, and the last one is the trained model.
    assert ns["checkpoints"] == [f"checkpoint-{e}.pt" for e in range(1, 7)]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == sorted(ns["checkpoints"])
    assert abs(ns["restored_accuracy"] - ns["hvd_result"]["accuracy"]) < 1e-9
    out, _ = capfd.readouterr()
    # Both ranks trained and reported, on the driver and on the cluster.
    assert len(re.findall(r"^\[rank [01]\] rank [01] of 2: test accuracy", out, re.M)) == 4


def test_02_tensorflow_keras_multiworker(spark, tmp_path):
    ns = run_notebook("02_tensorflow_keras_multiworker.py", spark, tmp_path)
    result = ns["keras_result"]
    assert result["replicas"] == 2
    assert len(result["loss"]) == 6 and result["loss"][-1] < result["loss"][0] / 3
    assert ns["keras_test_accuracy"] >= 0.9
    # Rank 0 alone saved the model.
    assert [p.name for p in tmp_path.iterdir()] == ["digits.keras"]


def test_03_partition_ensembles(spark, tmp_path, embedded_mlflow):
    output = tmp_path / "out"
    ns = run_notebook("03_partition_ensembles.py", spark, output)
    results = ns["results"]
    assert len(results) == 2 * 4
    ensembles = results[results["kind"] == "partition ensemble"]
    assert set(ensembles["models"]) == {2, 4, 8}
    for name, group in results.groupby("estimator"):
        one = group[group["kind"] == "one model, all rows"]["accuracy"].iloc[0]
        assert one >= 0.85, name
        # An ensemble of models that each saw 1/K of the rows stays close to one model.
        assert (group[group["kind"] == "partition ensemble"]["accuracy"] >= one - 0.05).all()
    xgb = ensembles[ensembles["estimator"] == "XGBoost"]
    assert (xgb["accuracy"] >= 0.9).all()

    plot = output / "ensemble_accuracy.png"
    assert plot.read_bytes()[:8] == PNG_MAGIC and plot.stat().st_size > 10_000

    mlflow = embedded_mlflow
    assert mlflow.get_tracking_uri() == f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = mlflow.get_run(ns["run"].info.run_id)
    best_accuracy = ns["best"].score(ns["test_pdf"][ns["features"]], ns["test_pdf"]["label"])
    assert run.data.metrics["test_accuracy"] == pytest.approx(best_accuracy)
    assert run.data.metrics["ensemble.n_estimators"] == 4
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id)}
    assert {"ensemble_accuracy.png", "sparkdist_ensemble_stats.json"} <= artifacts
    # spark_udf scoring agrees with the model itself.
    assert ns["udf_accuracy"] == pytest.approx(best_accuracy)
    assert (output / "scored.parquet" / "_SUCCESS").exists()


@pytest.mark.horovod
def test_04_horovod_timeline(spark, tmp_path):
    ns = run_notebook("04_horovod_timeline.py", spark, tmp_path)
    assert ns["result"]["accuracy"] >= 0.8
    for name in ("timeline.json", "timeline_from_env.json"):
        events = json.loads((tmp_path / name).read_text())
        assert any("ALLREDUCE" in e.get("name", "") for e in events), name
    summary = ns["summary"]
    assert "ALLREDUCE" in summary.index and summary.loc["ALLREDUCE", "count"] > 0
    assert len(ns["tensors"]) >= 4  # 2 weights + 2 biases, allreduced every step


def test_05_hyperparameter_search(spark, tmp_path, embedded_mlflow):
    ns = run_notebook("05_hyperparameter_search.py", spark, tmp_path)
    xgb = ns["xgb_study"]
    assert [t.state.name for t in xgb.trials] == ["COMPLETE"] * 6
    assert xgb.best_value < 0.45
    assert (tmp_path / "xgboost_search.png").read_bytes().startswith(PNG_MAGIC)
    import mlflow

    run = ns["search_run"]
    children = mlflow.search_runs(
        [run.info.experiment_id], f"tags.mlflow.parentRunId = '{run.info.run_id}'"
    )
    assert len(children) == 6
    good, poor = ns["ddp_study"].trials
    assert good.state.name == "COMPLETE" and good.value >= 0.9
    assert len(good.intermediate_values) == 4
    assert poor.state.name == "PRUNED" and len(poor.intermediate_values) < 4
    assert len(ns["resumed"].trials) == 2


def test_06_torch_frameworks(spark, tmp_path):
    ns = run_notebook("06_torch_frameworks.py", spark, tmp_path)
    initial = ns["initial_loss"]
    lightning = ns["lightning_result"]
    assert lightning["world_size"] == 2 and lightning["environment"] == "TorchElasticEnvironment"
    assert lightning["loss"] < initial / 4
    # FSDP: every parameter split in two along dim 0; the gathered model was saved and trained.
    shards = ns["fsdp_ranks"][0]["shards"]
    assert set(shards) == {f"{i}.{p}" for i in (0, 2, 4) for p in ("weight", "bias")}
    for local, full in shards.values():
        assert local == (full[0] // 2, *full[1:])
    assert [r["shards"] for r in ns["fsdp_ranks"]] == [shards, shards]
    assert (tmp_path / "fsdp_model.pt").exists()
    assert ns["fsdp_loss"] < initial / 4
    deepspeed = ns["deepspeed_result"]
    assert deepspeed["world_size"] == 2 and deepspeed["zero_stage"] == 1
    assert deepspeed["loss"] < initial / 4


def test_07_parameter_servers(spark, tmp_path):
    ns = run_notebook("07_parameter_servers.py", spark, tmp_path)
    assert ns["tf_result"]["workers"] == 2 and ns["tf_result"]["ps"] == 1
    assert ns["tf_ps_accuracy"] >= 0.9
    # Every trainer ran its epochs against the one server.
    assert sorted(ns["torch_views"][0]["steps"]) == [1, 2, 3]
    assert [v["steps"] for v in ns["torch_views"][1:]] == list(
        ns["torch_views"][0]["steps"].values()
    )
    assert ns["torch_ps_accuracy"] >= 0.9
