"""MLflow through the runner: rank 0 logs into the driver's active run, and the runner
records the job in it. Against a real `mlflow server` on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

from helpers import log_from_every_rank

from sparkdist import HorovodRunner


def test_rank_zero_logs_into_the_driver_run(sc, driver_mlflow):
    from mlflow import MlflowClient

    with driver_mlflow.start_run() as run:
        runner = HorovodRunner(np=2, launcher="direct")
        run_ids = runner.run_all(log_from_every_rank)
    assert run_ids[0] == run.info.run_id
    assert run_ids[1] != run.info.run_id
    data = MlflowClient().get_run(run.info.run_id).data
    assert data.metrics.get("from_rank_0") == 1.0
    assert "from_rank_1" not in data.metrics
    assert data.tags["sparkdist.np"] == "2"
    assert data.tags["sparkdist.launcher"] == "direct"
    assert data.tags["sparkdist.outcome"] == "succeeded"
    assert "torch" not in data.tags["sparkdist.backend"]
    # The job's trace and its picture, as artifacts of the run (issue 63).
    logged = {a.path for a in MlflowClient().list_artifacts(run.info.run_id, "sparkdist")}
    assert logged == {"sparkdist/trace.json", "sparkdist/timeline.html"}
    local = MlflowClient().download_artifacts(run.info.run_id, "sparkdist/trace.json")
    assert Path(local).read_bytes() == Path(runner.last_job.trace).read_bytes()


def test_no_active_run_needs_nothing(sc, driver_mlflow):
    def main():
        import os

        return {k: v for k, v in os.environ.items() if k.startswith("MLFLOW_RUN")}

    assert HorovodRunner(np=-2).run(main) == {}
