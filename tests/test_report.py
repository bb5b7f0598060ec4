"""`sparkdist.report` on a classic session: metrics from torch DDP, Horovod and
TensorFlow ranks (a barrier stage, mpirun, an elastic gang) arrive on the driver in
order, in the driver's MLflow run as step metrics and on `runner.last_job`; a
distributed tune trial is pruned by a reported value and its ranks stop; every Spark job
these submit is described in Spark's status store (what the Spark UI shows). Connect:
tests/spark/test_connect.py (scenario "report")."""

from __future__ import annotations

import logging

import optuna
import pytest
from installed import requires

import sparkdist
import sparkdist.tune
from sparkdist import HorovodRunner


def ddp_report(steps: int) -> int:
    """torch DDP over gloo: each step's all-reduced value reported by every rank (a
    one-element tensor, as training code has it)."""
    import torch
    import torch.distributed as dist

    import sparkdist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(steps):
        total = torch.tensor([float(step + rank)])
        dist.all_reduce(total)
        sparkdist.report({"loss": 1.0 / (step + 1), "sum": total}, step=step)
    dist.destroy_process_group()
    return rank


def horovod_report(steps: int) -> float:
    """Horovod: steps left to `report`'s own count (0, 1, 2, ...)."""
    import horovod.torch as hvd
    import torch

    import sparkdist

    hvd.init()
    for step in range(steps):
        mean = hvd.allreduce(torch.tensor([float(hvd.rank() + step)]), name=f"step{step}")
        sparkdist.report({"hvd_mean": mean.item()})
    hvd.shutdown()
    return 1.0


def tf_report(steps: int) -> int:
    """TensorFlow: a scalar tensor's value reported each step."""
    import os

    import tensorflow as tf

    import sparkdist

    rank = int(os.environ["RANK"])
    for step in range(steps):
        value = tf.reduce_sum(tf.constant([float(rank), float(step)]))
        sparkdist.report({"tf_value": value}, step=step)
    return rank


def pruned_objective(trial) -> float:
    """Would report 50 steps; the study's pruner stops it at step 2 on both ranks."""
    import sparkdist

    x = trial.suggest_float("x", 0.0, 1.0)
    for step in range(50):
        sparkdist.report({"val_loss": 10.0 - step + x}, step=step)
    return x


class PruneFromStep2(optuna.pruners.BasePruner):
    def prune(self, study, trial) -> bool:
        return trial.last_step is not None and trial.last_step >= 2


def spark_jobs(sc) -> list[tuple[str, str]]:
    """(job group, description) of every Spark job so far, as the Spark UI shows them
    (read from Spark's status store, which backs the UI and its REST API)."""
    found = []
    jobs = sc._jsc.sc().statusStore().jobsList(None)
    for index in range(jobs.size()):
        job = jobs.apply(index)
        group, description = job.jobGroup(), job.description()
        if group.isDefined() and description.isDefined():
            found.append((group.get(), description.get()))
    return found


def spark_job_descriptions(sc) -> dict[str, str]:
    """Job group -> description, for groups of one job (each runner job's)."""
    return dict(spark_jobs(sc))


def steps_of(job, rank: int) -> list[int]:
    return [entry.step for entry in job.reported if entry.rank == rank]


@requires("torch", "pip install torch (make venv)")
def test_ddp_reports_every_rank_in_order_into_mlflow(sc, driver_mlflow):
    with driver_mlflow.start_run() as run:
        runner = HorovodRunner(np=2, launcher="direct", report_ranks="all")
        assert runner.run(ddp_report, steps=4) == 0
    job = runner.last_job
    assert steps_of(job, 0) == steps_of(job, 1) == [0, 1, 2, 3]
    assert job.metrics == {"loss": 0.25, "sum": 7.0}  # (3 + 0) + (3 + 1)
    assert job.metrics_by_rank[1] == job.metrics
    client = driver_mlflow.MlflowClient()
    for rank in (0, 1):
        history = client.get_metric_history(run.info.run_id, f"rank{rank}/sum")
        assert [(m.step, m.value) for m in history] == [(s, 2.0 * s + 1) for s in range(4)]
    descriptions = spark_job_descriptions(sc)
    assert descriptions[f"sparkdist-{job.job_id}"] == (
        f"sparkdist ddp_report: 2 ranks, barrier, attempt 1 (job {job.job_id})"
    )


@requires("horovod.torch", "make horovod")
def test_horovod_rank_zero_reports_into_mlflow_under_their_names(sc, driver_mlflow):
    with driver_mlflow.start_run() as run:
        runner = HorovodRunner(np=2, launcher="mpi")
        runner.run(horovod_report, steps=3)
    job = runner.last_job
    assert steps_of(job, 0) == steps_of(job, 1) == [0, 1, 2]
    history = driver_mlflow.MlflowClient().get_metric_history(run.info.run_id, "hvd_mean")
    assert [(m.step, m.value) for m in history] == [(0, 0.5), (1, 1.5), (2, 2.5)]
    metrics = driver_mlflow.MlflowClient().get_run(run.info.run_id).data.metrics
    assert not [name for name in metrics if name.startswith("rank")]  # rank 0's only


@requires("tensorflow", "pip install tensorflow-cpu (make venv)")
def test_tensorflow_reports_from_an_elastic_gang(sc):
    runner = HorovodRunner(np=2, min_np=1, max_np=2, launcher="direct", start_timeout=120)
    runner.run(tf_report, steps=3)
    job = runner.last_job
    assert steps_of(job, 0) == [0, 1, 2]
    assert job.metrics == {"tf_value": 2.0}
    assert job.metrics_by_rank.get(1, {"tf_value": 3.0}) == {"tf_value": 3.0}
    description = spark_job_descriptions(sc)[f"sparkdist-{job.job_id}"]
    assert description.startswith("sparkdist tf_report: 2 ranks, elastic gang of 2 tasks")


def test_a_distributed_trial_is_pruned_by_a_reported_value(sc):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(pruner=PruneFromStep2())
    sparkdist.tune.optimize(study, pruned_objective, n_trials=1, np=2)
    trial = study.trials[0]
    assert trial.state == optuna.trial.TrialState.PRUNED
    # Rank 0's values fed the pruner until it said stop: the ranks went no further.
    assert sorted(trial.intermediate_values) == [0, 1, 2]
    assert trial.intermediate_values[2] == pytest.approx(8.0 + trial.params["x"])
    described = [d for d in spark_job_descriptions(sc).values() if d.endswith("tune trial 0")]
    # The status store lists every test's jobs, in no promised order: this trial's is among them.
    assert any(d.startswith("sparkdist pruned_objective: 2 ranks, barrier") for d in described)


def test_the_ensemble_training_job_is_described(spark):
    from sklearn.datasets import load_breast_cancer
    from sklearn.linear_model import LogisticRegression

    from sparkdist.ensemble import PartitionEnsemble

    X, y = load_breast_cancer(return_X_y=True)
    rows = [(float(label), *map(float, x[:4])) for x, label in zip(X, y, strict=True)]
    df = spark.createDataFrame(rows, ["label", "a", "b", "c", "d"])
    sc = spark.sparkContext
    # As a Databricks notebook cell runs: a job group its Cancel button cancels, kept.
    sc.setJobGroup("notebook-cell-7", "cell 7")
    try:
        PartitionEnsemble(LogisticRegression(max_iter=500), n_estimators=2, random_state=1).fit(
            df, features_col=["a", "b", "c", "d"], label_col="label"
        )
        assert sc.getLocalProperty("spark.jobGroup.id") == "notebook-cell-7"
        assert sc.getLocalProperty("spark.job.description") == "cell 7"
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
    assert ("notebook-cell-7", "sparkdist ensemble: 2 x LogisticRegression") in spark_jobs(sc)


def test_report_checks_its_input_and_logs_outside_a_rank(caplog):
    with pytest.raises(ValueError, match="non-empty dict"):
        sparkdist.report({})
    with pytest.raises(ValueError, match="metric 'loss' must be a number"):
        sparkdist.report({"loss": "low"})
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        sparkdist.report({"loss": 1.0}, step=-1)
    with pytest.raises(ValueError, match="report_ranks must be one of"):
        HorovodRunner(np=2, report_ranks="some")
    with caplog.at_level(logging.INFO, logger="sparkdist"):
        sparkdist.report({"loss": 0.5}, step=3)
    assert "report step 3: loss=0.5" in caplog.text
