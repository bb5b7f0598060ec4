"""A Spark Connect client process for tests/test_connect.py: no JVM, no SparkContext.

    python tests/connect_client.py SCENARIO  (SPARK_REMOTE=sc://host:port)

Each scenario drives sparkdist through the Connect session and prints one JSON line,
prefixed with RESULT, that the test reads. The client first proves it is a real
Connect client: its session is pyspark's Connect session and no JVM was started.
"""

from __future__ import annotations

import json
import os
import sys
import time

import psutil


def connect():
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(os.environ["SPARK_REMOTE"]).getOrCreate()
    assert type(spark).__module__ == "pyspark.sql.connect.session", type(spark)
    return spark


def no_jvm() -> bool:
    """No SparkContext and no java child: this process is only a gRPC client."""
    from pyspark import SparkContext

    java = [p for p in psutil.Process().children(recursive=True) if "java" in p.name()]
    return SparkContext._active_spark_context is None and not java


def rank_value(x):
    import os

    print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} says hello", flush=True)
    return {"rank": int(os.environ["RANK"]), "value": int(os.environ["RANK"]) * x}


def raise_on_rank_1():
    import os

    if os.environ["RANK"] == "1":
        raise ValueError("deliberate failure on rank 1 (connect test)")
    return "ok"


def hang_forever(path):
    import os
    import time

    with open(os.path.join(path, f"rank{os.environ['RANK']}.pid"), "w") as f:
        f.write(str(os.getpid()))
    print("ranks started", flush=True)
    while True:
        time.sleep(1)


def read_ids(train):
    """Every id this rank's shard holds, read once."""
    ids = []
    with train.make_torch_dataloader(batch_size=16, num_epochs=1) as loader:
        for batch in loader:
            ids += batch["id"].tolist()
    return ids


def scenario_values(spark):
    from sparkdist import HorovodRunner

    out = {}
    for launcher in ("direct", "mpi"):
        runner = HorovodRunner(np=2, launcher=launcher)
        out[launcher] = runner.run_all(rank_value, x=5)
    return out


def scenario_failure(spark):
    from sparkdist import HorovodRunner, RankFailedError

    runner = HorovodRunner(np=2)
    try:
        runner.run(raise_on_rank_1)
    except RankFailedError as exc:
        return {
            "error": type(exc).__name__,
            "message": str(exc),
            "outcome": runner.last_job.outcome,
        }
    return {"error": None}


def scenario_timeout(spark):
    import tempfile

    from sparkdist import HorovodRunner, JobTimeoutError

    runner = HorovodRunner(np=2, timeout=15)
    started = time.monotonic()
    try:
        runner.run(hang_forever, path=tempfile.mkdtemp())
    except JobTimeoutError as exc:
        return {
            "error": type(exc).__name__,
            "message": str(exc),
            "seconds": time.monotonic() - started,
            "alive": alive(runner),
        }
    return {"error": None}


def scenario_slots(spark):
    from sparkdist import HorovodRunner, NotEnoughSlotsError

    started = time.monotonic()
    try:
        HorovodRunner(np=3).run(rank_value, x=1)
    except NotEnoughSlotsError as exc:
        return {
            "error": type(exc).__name__,
            "message": str(exc),
            "seconds": time.monotonic() - started,
        }
    return {"error": None}


def scenario_interrupt(spark):
    """Runs a hanging job until the test sends SIGINT; then proves nothing is left."""
    import tempfile

    from sparkdist import HorovodRunner

    runner = HorovodRunner(np=2)
    try:
        runner.run(hang_forever, path=tempfile.mkdtemp())
    except KeyboardInterrupt:
        pass
    interrupted = runner.last_job.outcome
    # The stage released its slots: the next job gets both at once and runs.
    again = HorovodRunner(np=2, start_timeout=60).run_all(rank_value, x=1)
    return {
        "outcome": interrupted,
        "recorded": [(p.pid, p.role) for p in runner.last_job.processes],
        "alive": alive(runner),
        "again": again,
    }


def scenario_data(spark):
    from sparkdist import HorovodRunner

    df = spark.range(0, 1000, 1, 4).selectExpr("id", "cast(id % 7 as double) as x")
    return {"ids": HorovodRunner(np=2).run_all(read_ids, train=df)}


def scenario_ensemble(spark):
    import numpy as np
    import pandas as pd
    from sklearn.datasets import load_breast_cancer
    from sklearn.linear_model import LogisticRegression

    from sparkdist.ensemble import PartitionEnsemble

    X, y = load_breast_cancer(return_X_y=True)
    data = pd.DataFrame(X, columns=[f"f{i}" for i in range(X.shape[1])])
    data["label"] = y
    df = spark.createDataFrame(data)
    columns = [c for c in data.columns if c != "label"]
    model = PartitionEnsemble(LogisticRegression(max_iter=2000), n_estimators=2, random_state=0)
    model = model.fit(df, columns)
    result = model.transform(df).select(*columns, "label", "prediction").toPandas()
    predicted = model.predict(result[columns].to_numpy())
    # The Spark ML wrapper fits and transforms; its Spark ML persistence says why not.
    from pyspark.ml.feature import VectorAssembler

    from sparkdist.ensemble import SparkPartitionEnsemble
    from sparkdist.errors import ConnectUnsupportedError

    vectors = VectorAssembler(inputCols=columns, outputCol="features").transform(df)
    stage = SparkPartitionEnsemble(estimator=LogisticRegression(max_iter=2000), nEstimators=2)
    staged = stage.fit(vectors)
    ml_rows = staged.transform(vectors).count()
    try:
        staged.write().save("/tmp/never-written")
        persistence_error = None
    except ConnectUnsupportedError as exc:
        persistence_error = str(exc)
    parquet = parquet_ensembles(spark, data, columns)
    return {
        **parquet,
        "ml_rows": ml_rows,
        "persistence_error": persistence_error,
        "n_models": len(model.estimators_),
        "equal": bool(np.array_equal(result["prediction"].to_numpy(), predicted)),
        "accuracy": float((predicted == result["label"].to_numpy()).mean()),
        "rows": len(result),
    }


def parquet_ensembles(spark, data, columns):
    """A plain Parquet scan, seen in the Connect client's plan, is read by pyarrow and gives
    the ensemble Spark's reader gives (one file, one partition: the same spread)."""
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="sparkdist-connect-parquet-")
    try:
        return _parquet_ensembles(spark, data, columns, path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _parquet_ensembles(spark, data, columns, path):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F
    from xgboost import XGBClassifier

    from sparkdist.ensemble import PartitionEnsemble
    from sparkdist.ensemble.features import FeatureSpec
    from sparkdist.ensemble.parquet_source import find_parquet_source
    from sparkdist.spark import session_slots

    table = pa.Table.from_pandas(data, preserve_index=False)
    pq.write_table(table, f"{path}/part-0.parquet")  # one row group, as Spark reads it
    direct = spark.read.parquet(path)
    filtered = direct.filter(F.col("label") >= 0)
    spec = FeatureSpec(n_features=len(columns), feature_cols=tuple(columns))
    slots = session_slots(spark)
    models = [
        PartitionEnsemble(
            XGBClassifier(n_estimators=20, n_jobs=1), n_estimators=2, random_state=4
        ).fit(df, columns)
        for df in (direct, filtered)
    ]
    X = data[columns].to_numpy()
    local = PartitionEnsemble(
        XGBClassifier(n_estimators=20, n_jobs=1), n_estimators=2, random_state=4, shuffle=False
    ).fit(direct, columns)
    return {
        "parquet_local_rows": [s.rows for s in local.estimators_stats_],
        "parquet_local_accuracy": local.score(X, data["label"].to_numpy()),
        "parquet_direct": find_parquet_source(direct, spec, "label", True, slots) is not None,
        "parquet_filtered_direct": (
            find_parquet_source(filtered, spec, "label", True, slots) is not None
        ),
        "parquet_rows": [s.rows for s in models[0].estimators_stats_],
        "parquet_same": bool(
            np.array_equal(models[0].predict_proba(X), models[1].predict_proba(X))
        ),
    }


def log_from_every_rank():
    import os

    import mlflow

    rank = int(os.environ["RANK"])
    mlflow.log_metric(f"from_rank_{rank}", rank + 1.0)
    active = mlflow.active_run()
    return active.info.run_id if active else None


def scenario_mlflow(spark):
    """Rank 0 logs into the client's active run (MLFLOW_TRACKING_URI: a real server)."""
    import mlflow

    from sparkdist import HorovodRunner

    with mlflow.start_run() as run:
        run_ids = HorovodRunner(np=2, launcher="direct").run_all(log_from_every_rank)
    data = mlflow.MlflowClient().get_run(run.info.run_id).data
    return {
        "run_id": run.info.run_id,
        "rank_run_ids": run_ids,
        "metrics": data.metrics,
        "tags": {k: v for k, v in data.tags.items() if k.startswith("sparkdist.")},
    }


def scenario_relay_values(spark):
    """np=3 on the namespaced cluster, from a client the executors cannot reach."""
    from sparkdist import HorovodRunner

    return {launcher: HorovodRunner(np=3, launcher=launcher).run_all(rank_value, x=5)
            for launcher in ("direct", "mpi")}  # fmt: skip


def scenario_relay_no_checkpoint_dir(spark):
    from sparkdist import HorovodRunner, SparkdistError

    try:
        HorovodRunner(np=3, max_failures=1).run(rank_value, x=1)
    except SparkdistError as exc:
        return {"error": str(exc)}
    return {"error": None}


def scenario_relay_resume(spark):
    """The cluster suite's resumable DDP training, relaunched after a lost executor, its
    checkpoints in a directory every host shares (SCENARIO_ARGS: checkpoint_dir,
    progress_dir)."""
    import jobs  # tests/cluster, on PYTHONPATH

    from sparkdist import HorovodRunner

    args = json.loads(os.environ["SCENARIO_ARGS"])
    runner = HorovodRunner(
        np=3, max_failures=1, checkpoint_dir=args["checkpoint_dir"], start_timeout=120,
        timeout=300,
    )  # fmt: skip
    values = runner.run_all(
        jobs.resumable_main,
        epochs=args["epochs"],
        progress_dir=args["progress_dir"],
        epoch_s=args["epoch_s"],
    )
    return {
        "rank0": values[0],
        "attempts": runner.last_job.attempts,
        "failures": runner.last_job.failures,
        "alive": alive(runner),
    }


def alive(runner) -> list[int]:
    """The job's recorded processes that still run 15 s after the job ended (tasks stop
    them as they end, which may be just after the client has its answer)."""
    deadline = time.monotonic() + 15
    running = [r for r in runner.last_job.processes if r.alive()]
    while running and time.monotonic() < deadline:
        time.sleep(0.1)
        running = [r for r in running if r.alive()]
    return [r.pid for r in running]


def main() -> None:
    scenario = sys.argv[1]
    spark = connect()
    result = globals()[f"scenario_{scenario}"](spark)
    result["no_jvm"] = no_jvm()
    print("RESULT " + json.dumps(result), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
