"""`sparkdist demo`: every path end to end (DDP, Horovod with a timeline, TensorFlow,
a partition ensemble against one model), tracked in the embedded MLflow store, with the
summary table at the end. The test runs the real command, as a user does, with fewer
epochs, in a new process; the suite's one demo run, so its whole output is also checked
for being clean (tests/output_checks.py)."""

from __future__ import annotations

import json
import re

import pytest
from output_checks import assert_clean, run_command

ROWS = {
    "runner: PyTorch DDP": ("2 ranks", 0.9),
    "runner: Horovod (torch)": ("2 ranks", 0.9),
    "runner: TensorFlow MWMS": ("2 ranks", 0.9),
    "partition ensemble (XGBoost)": ("4 models", 0.85),
    "one model, all rows (XGBoost)": ("1 model", 0.85),
}


@pytest.mark.horovod
def test_demo_runs_every_path(tmp_path, embedded_mlflow):
    out = run_command(
        ["-m", "sparkdist", "demo", "--epochs", "10", "--tf-epochs", "6", "--models", "4"],
        tmp_path,
    )
    assert_clean(out)

    # The summary table: every path ran and reached its accuracy.
    table = out[out.index("== Summary") :]
    for task, (size, minimum) in ROWS.items():
        match = re.search(rf"^{re.escape(task)} +{size} +([\d.]+) +([\d.]+)s", table, re.M)
        assert match, (task, table)
        assert float(match.group(1)) >= minimum, (task, match.group(0))
    assert "demo finished: every part ran" in out
    # DDP and Horovod streamed rank 0's epochs.
    assert len(re.findall(r"^\[rank 0\] epoch +\d+ +loss", out, re.M)) == 20

    # The Horovod timeline came back to the driver; rank 0 alone checkpointed.
    output = tmp_path / "sparkdist-demo"
    assert f"timeline:       {output / 'horovod_timeline.json'}" in out
    events = json.loads((output / "horovod_timeline.json").read_text())
    assert any("ALLREDUCE" in e.get("name", "") for e in events)
    assert len(list((output / "horovod_checkpoints").iterdir())) == 10
    assert (output / "digits.keras").exists()

    # MLflow: one run per part in the embedded store, with the accuracies of the table.
    mlflow = embedded_mlflow
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert f"MLflow:         experiment 'sparkdist-demo' in {uri}" in out
    mlflow.set_tracking_uri(uri)  # the fixture puts the process's URI back
    runs = mlflow.search_runs(experiment_names=["sparkdist-demo"], output_format="list")
    by_name = {run.info.run_name: run for run in runs}
    assert set(by_name) == {"ddp", "horovod", "tensorflow", "partition-ensemble"}
    assert all(r.data.metrics["test_accuracy"] >= 0.85 for r in runs)
    # The runner tagged each job's run (np, launcher, frameworks, outcome).
    assert by_name["horovod"].data.tags["sparkdist.outcome"] == "succeeded"
    assert "horovod" in by_name["horovod"].data.tags["sparkdist.backend"]
    assert by_name["tensorflow"].data.tags["sparkdist.np"] == "2"
    ensemble_run = by_name["partition-ensemble"]
    assert ensemble_run.data.metrics["ensemble.n_estimators"] == 4
    [logged] = mlflow.search_logged_models(
        experiment_ids=[ensemble_run.info.experiment_id],
        filter_string=f"source_run_id = '{ensemble_run.info.run_id}'",
        output_format="list",
    )
    assert logged.name == "ensemble"
