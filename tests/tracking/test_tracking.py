"""sparkdist.tracking against a real `mlflow server` (SQLite backend) on 127.0.0.1.

The "driver" is this test process; ranks are plain subprocesses with RANK set, as the
runner starts them. What arrived is checked through MlflowClient.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import time

from mlflow_fixture import clean_env

from sparkdist import tracking
from sparkdist.tracking.uris import absolute_tracking_uri, redact_uri

TOKEN = "sparkdist-test-token-6f1d0c9a"


def test_uris_absolute_and_redacted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute_tracking_uri("sqlite:///mlflow.db") == f"sqlite:///{tmp_path}/mlflow.db"
    assert absolute_tracking_uri("sqlite:////abs/m.db") == "sqlite:////abs/m.db"
    assert absolute_tracking_uri("file:./mlruns") == (tmp_path / "mlruns").as_uri()
    assert absolute_tracking_uri("mlruns") == (tmp_path / "mlruns").as_uri()
    assert absolute_tracking_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert absolute_tracking_uri("databricks") == "databricks"
    assert tracking.default_tracking_uri() == f"sqlite:///{tmp_path}/mlflow.db"
    assert redact_uri("https://me:pw@host:5000/x") == "https://me:***@host:5000/x"


def test_no_active_run_means_nothing_to_pass(driver_mlflow):
    assert driver_mlflow.active_run() is None
    assert tracking.rank_environment() == {} and tracking.rank0_credentials() == {}
    tracking.log_job(np=2, launcher="x", backend="y", wall_time_s=1.0, outcome="ok")  # no-op


def test_setup_rank_is_cheap_and_keeps_other_ranks_out():
    script = textwrap.dedent(
        """
        import os, sys
        from sparkdist.tracking import autolog, setup_rank
        os.environ["RANK"] = "0"
        setup_rank()  # no driver run: nothing to do
        assert "mlflow" not in sys.modules, "imported mlflow without a driver run"
        os.environ.update(RANK="1", MLFLOW_RUN_ID="0123456789abcdef")
        setup_rank()
        assert "MLFLOW_RUN_ID" not in os.environ
        assert autolog() is False
        assert "mlflow" not in sys.modules, "imported mlflow on rank 1"
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


RANK_SCRIPT = """
import json, logging, os, sys
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
from sparkdist.tracking import autolog, setup_rank

setup_rank()
import mlflow
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression

rank = int(os.environ["RANK"])
enabled = autolog(log_models=False, log_datasets=False, silent=True)
x, y = load_digits(return_X_y=True)
LogisticRegression(C=0.5, max_iter=30).fit(x[:300] / 16, y[:300])
mlflow.log_metric("rank_metric", rank)
print(json.dumps({"autolog": enabled, "run_id": mlflow.active_run().info.run_id}))
"""


def test_rank0_logs_into_the_driver_run_and_others_do_not(
    driver_mlflow, mlflow_server, monkeypatch, caplog
):
    mlflow = driver_mlflow
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", TOKEN)
    caplog.set_level(logging.DEBUG)
    experiment_id = mlflow.create_experiment(f"sparkdist-ranks-{time.time_ns()}")
    run = mlflow.start_run(experiment_id=experiment_id)
    driver_run_id = run.info.run_id

    env = tracking.rank_environment()
    assert env["MLFLOW_TRACKING_URI"] == mlflow_server
    assert env["MLFLOW_RUN_ID"] == driver_run_id
    assert env["MLFLOW_EXPERIMENT_ID"] == experiment_id
    assert "MLFLOW_TRACKING_TOKEN" not in env  # credentials go to rank 0 alone...
    env.update(tracking.rank0_credentials())
    assert env["MLFLOW_TRACKING_TOKEN"] == TOKEN  # ...with its welcome
    assert "MLFLOW_TRACKING_TOKEN" in caplog.text
    assert TOKEN not in caplog.text  # ...never into the logs

    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT],
            env=clean_env(**env, RANK=str(rank), WORLD_SIZE="2"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=150))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
        assert TOKEN not in out and TOKEN not in err
    # MLflow prints "View run ..." lines at exit too; the script's own line is JSON.
    rank0, rank1 = (
        json.loads(next(line for line in out.splitlines() if line.startswith("{")))
        for out, _ in outputs
    )
    assert rank0 == {"autolog": True, "run_id": driver_run_id}
    assert rank1["autolog"] is False and rank1["run_id"] != driver_run_id

    client = mlflow.MlflowClient(mlflow_server)
    driver_run = client.get_run(driver_run_id)
    assert driver_run.data.metrics["rank_metric"] == 0
    assert [m.value for m in client.get_metric_history(driver_run_id, "rank_metric")] == [0]
    assert driver_run.data.params["C"] == "0.5"  # autologged, from rank 0
    assert driver_run.data.params["max_iter"] == "30"
    assert driver_run.info.status == "RUNNING"  # rank 0's exit left the driver's run open

    others = [r for r in client.search_runs([experiment_id]) if r.info.run_id != driver_run_id]
    assert [r.info.run_id for r in others] == [rank1["run_id"]]
    assert others[0].data.metrics == {"rank_metric": 1}
    assert others[0].data.params == {}  # no autologging on rank 1

    tracking.log_job(np=2, launcher="subprocess", backend="torch", wall_time_s=3.5, outcome="ok")
    tracking.log_job(np=2, launcher="subprocess", backend="torch", wall_time_s=4.5, outcome="ok")
    mlflow.end_run()
    finished = client.get_run(driver_run_id)
    assert finished.info.status == "FINISHED"
    tags = finished.data.tags
    assert tags["sparkdist.np"] == "2" and tags["sparkdist.launcher"] == "subprocess"
    assert tags["sparkdist.backend"] == "torch" and tags["sparkdist.outcome"] == "ok"
    history = client.get_metric_history(driver_run_id, "sparkdist.wall_time_s")
    assert sorted(m.value for m in history) == [3.5, 4.5]
    assert TOKEN not in caplog.text


def test_embedded_default_is_sqlite_in_the_working_directory(tmp_path):
    script = textwrap.dedent(
        """
        import os
        import mlflow
        from sparkdist.tracking import default_tracking_uri, use_default_tracking

        os.environ["MLFLOW_TRACKING_URI"] = "http://127.0.0.1:9"
        assert use_default_tracking() == "http://127.0.0.1:9"  # configured: left alone
        del os.environ["MLFLOW_TRACKING_URI"]
        uri = use_default_tracking()
        assert uri == default_tracking_uri() == f"sqlite:///{os.getcwd()}/mlflow.db", uri
        with mlflow.start_run() as run:
            mlflow.log_metric("m", 1.0)
        assert mlflow.MlflowClient(uri).get_run(run.info.run_id).data.metrics == {"m": 1.0}
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
    assert (tmp_path / "mlflow.db").is_file()
