"""A Spark Connect client process for tests/spark/test_connect.py: no JVM, no SparkContext.

    python tests/connect_client.py SCENARIO  (SPARK_REMOTE=sc://host:port)

Each scenario drives sparkdist through the Connect session and prints one JSON line,
prefixed with RESULT, that the test reads. The client first proves it is a real
Connect client: its session is pyspark's Connect session and no JVM was started.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time

import psutil
from helpers import frame, log_from_every_rank, sleeps_unless_first, still_alive


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
    # Elastic: plain tasks (mapInArrow without barrier) seated by the job's gang.
    elastic = HorovodRunner(np=2, min_np=1, max_np=2)
    out["elastic"] = elastic.run_all(rank_value, x=5)
    out["elastic_alive"] = alive(elastic)
    # A warm world on a Connect session whose executors reach this client.
    with HorovodRunner(np=2, launcher="direct", keep_warm=120) as warm:
        out["warm"] = [warm.run_all(os.getpid) for _ in range(2)]
    out["warm_alive"] = alive(warm)
    out.update(relayed_warm_runs())
    return out


def pid_and_tenfold(x):
    """The rank's pid, 10 * x, and the checkpoint it found (saving one of its own)."""
    import os

    from sparkdist import checkpoint

    print(f"relayed warm run with x={x}", flush=True)
    found = checkpoint.resume()
    checkpoint.save({"x": x}, 1)
    return [os.getpid(), 10 * x, found]


def relayed_warm_runs() -> dict:
    """A warm world in relay mode (one rank: its stage takes both slots, one of which
    its first task frees for the Spark tasks that carry the runs), two runs, closed."""
    from sparkdist import HorovodRunner
    from sparkdist.job_environment import CONNECT_RELAY

    os.environ[CONNECT_RELAY] = "always"
    try:
        with HorovodRunner(np=1, launcher="direct", keep_warm=120) as relayed:
            runs = [relayed.run(pid_and_tenfold, x=x) for x in (2, 3)]
    finally:
        del os.environ[CONNECT_RELAY]
    return {"relay_warm": runs, "relay_warm_alive": alive(relayed)}


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
    """A copied DataFrame and a Parquet scan read in place, both from the client's plan."""
    import shutil
    import tempfile
    from pathlib import Path

    from sparkdist import HorovodRunner
    from sparkdist.data import CACHE_DIR_CONF, make_spark_converter
    from sparkdist.spark.file_scan import plain_file_scan

    work = Path(tempfile.mkdtemp(prefix="sparkdist-connect-data-"))
    spark.conf.set(CACHE_DIR_CONF, (work / "cache").as_uri())
    try:
        df = spark.range(0, 1000, 1, 4).selectExpr("id", "cast(id % 7 as double) as x")
        df.write.parquet(str(work / "source"))
        direct = spark.read.parquet(str(work / "source")).select("id")
        delta = spark.read.format("delta").load(str(work / "source"))  # planned, never run
        return {
            "ids": HorovodRunner(np=2).run_all(read_ids, train=df),
            "direct_ids": HorovodRunner(np=2).run_all(read_ids, train=direct),
            "direct_source": make_spark_converter(direct).source,
            "cache_left": [str(p) for p in (work / "cache").rglob("*") if p.is_file()],
            "delta_scan": plain_file_scan(delta, ["id"]).format,
        }
    finally:
        spark.conf.unset(CACHE_DIR_CONF)
        shutil.rmtree(work, ignore_errors=True)


def scenario_ensemble(spark):
    import numpy as np
    from sklearn.datasets import load_breast_cancer
    from sklearn.linear_model import LogisticRegression

    from sparkdist.ensemble import PartitionEnsemble

    data = frame(*load_breast_cancer(return_X_y=True))
    df = spark.createDataFrame(data)
    columns = [c for c in data.columns if c != "label"]
    # liblinear: on these unscaled features lbfgs takes ~1,900 iterations (3 CPU seconds a
    # model), liblinear a few milliseconds, to the same accuracy.
    estimator = LogisticRegression(solver="liblinear")
    model = PartitionEnsemble(estimator, n_estimators=2, random_state=0).fit(df, columns)
    result = model.transform(df).select(*columns, "label", "prediction").toPandas()
    predicted = model.predict(result[columns].to_numpy())
    # The Spark ML wrapper fits and transforms; its Spark ML persistence says why not.
    from pyspark.ml.feature import VectorAssembler

    from sparkdist.ensemble import SparkPartitionEnsemble
    from sparkdist.errors import ConnectUnsupportedError

    vectors = VectorAssembler(inputCols=columns, outputCol="features").transform(df)
    stage = SparkPartitionEnsemble(estimator=LogisticRegression(solver="liblinear"), nEstimators=2)
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
    the ensemble Spark's reader gives (one file, one partition: the same spread; 3 models
    on 2 slots, so the direct read spreads rather than reads in place)."""
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
    from sparkdist.ensemble.fit.parquet_source import find_parquet_source
    from sparkdist.ensemble.model.features import FeatureSpec
    from sparkdist.spark import session_slots

    table = pa.Table.from_pandas(data, preserve_index=False)
    pq.write_table(table, f"{path}/part-0.parquet")  # one row group, as Spark reads it
    direct = spark.read.parquet(path)
    filtered = direct.filter(F.col("label") >= 0)
    spec = FeatureSpec(n_features=len(columns), feature_cols=tuple(columns))
    slots = session_slots(spark)
    models = [
        PartitionEnsemble(
            XGBClassifier(n_estimators=20, n_jobs=1), n_estimators=3, random_state=4
        ).fit(df, columns)
        for df in (direct, filtered)
    ]
    X = data[columns].to_numpy()
    in_place = PartitionEnsemble(
        XGBClassifier(n_estimators=20, n_jobs=1), n_estimators=2, random_state=4
    ).fit(direct, columns)
    local = PartitionEnsemble(
        XGBClassifier(n_estimators=20, n_jobs=1), n_estimators=2, random_state=4, shuffle=False
    ).fit(direct, columns)
    return {
        "parquet_local_rows": [s.rows for s in local.estimators_stats_],
        "parquet_local_accuracy": local.score(X, data["label"].to_numpy()),
        "parquet_in_place_rows": [s.rows for s in in_place.estimators_stats_],
        "parquet_in_place_accuracy": in_place.score(X, data["label"].to_numpy()),
        "parquet_direct": find_parquet_source(direct, spec, "label", True, slots) is not None,
        "parquet_filtered_direct": (
            find_parquet_source(filtered, spec, "label", True, slots) is not None
        ),
        "parquet_rows": [s.rows for s in models[0].estimators_stats_],
        "parquet_same": bool(
            np.array_equal(models[0].predict_proba(X), models[1].predict_proba(X))
        ),
    }


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

    return {
        launcher: HorovodRunner(np=3, launcher=launcher).run_all(rank_value, x=5)
        for launcher in ("direct", "mpi")
    }


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
        np=3,
        max_failures=1,
        checkpoint_dir=args["checkpoint_dir"],
        start_timeout=120,
        timeout=300,
    )
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


def waits_in_silence():
    """Says it is ready, then waits without a sign of life (a hung rank)."""
    print("ready", flush=True)
    while True:
        time.sleep(1)


def scenario_relay_stall(spark):
    """A stall in relay mode (SPARKDIST_CONNECT_RELAY=always): the warning and the
    error, with where each rank was, reach the client."""
    from sparkdist import HorovodRunner
    from sparkdist.errors import JobStalledError

    runner = HorovodRunner(np=2, launcher="direct", stall_warning=4, stall_timeout=12)
    started = time.monotonic()
    try:
        runner.run(waits_in_silence)
    except JobStalledError as exc:
        return {
            "error": str(exc),
            "stacks": exc.stacks,
            "seconds": time.monotonic() - started,
            "alive": alive(runner),
            "job_id": runner.last_job.job_id,
            "trace": traced(runner.last_job.trace),
        }
    return {"error": None}


def traced(path: str | None) -> dict:
    """What the test reads of a job's trace: its problems, the names of its processes,
    its slices and its instants by process, and its stalls."""
    import json

    from sparkdist.trace import validate

    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    return {
        "problems": validate.problems(trace),
        "processes": sorted(names.values()),
        "slices": sorted({f"{e['pid']}:{e['name']}" for e in events if e["ph"] == "X"}),
        "instants": sorted({f"{e['pid']}:{e['name']}" for e in events if e["ph"] == "i"}),
    }


def scenario_relay_interrupt(spark):
    """A relay-mode job stuck in user code until the test sends SIGINT (its ranks note
    their pids in RANKS_DIR). RANKS_PER_TASK=2: one task holds both ranks, the other
    slot is free; 1: the job holds every slot. LAUNCHER: direct (default) or mpi."""
    from sparkdist import HorovodRunner

    per_task = int(os.environ["RANKS_PER_TASK"])
    launcher = os.environ.get("LAUNCHER", "direct")
    runner = HorovodRunner(np=2, ranks_per_task=per_task, launcher=launcher)
    try:
        runner.run(hang_forever, path=os.environ["RANKS_DIR"])
    except KeyboardInterrupt:
        pass
    return {"outcome": runner.last_job.outcome, "job_id": runner.last_job.job_id}


def tune_objective(trial):
    """Reads shared data; reports steps for the pruner; trial 2 fails; records its task."""
    import os
    import time

    import optuna
    from pyspark import TaskContext

    x = trial.suggest_float("x", 0.0, 1.0)
    context = TaskContext.get()
    trial.set_user_attr("task", [context.stageId(), context.partitionId(), os.getpid()])
    trial.set_user_attr("shared_sum", float(SHARED[0].value.sum()))
    # Trial 0 waits (up to 60 s) until a trial started in another process: both workers
    # run trials whatever the load.
    open(os.path.join(RENDEZVOUS[0], str(os.getpid())), "w").close()
    deadline = time.monotonic() + 60
    while trial.number == 0 and len(os.listdir(RENDEZVOUS[0])) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    if trial.number == 2:
        raise ValueError("trial 2 fails (connect test)")
    for step in range(3):
        trial.report(x + 1.0 / (step + 1), step)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return x


SHARED: list = []  # the share() handle, set by the scenario (pickled with the objective)
RENDEZVOUS: list = []  # a directory, set by the scenario


def uses_spark_context(trial):
    """What `spark.sparkContext` does in a trial on Connect (pyspark's own error)."""
    from pyspark.sql.connect.session import SparkSession

    trial.suggest_float("x", 0.0, 1.0)
    return object.__new__(SparkSession).sparkContext


TIMED_LIMIT_S = 15.0


def sleeps_past_the_time_limit(trial, deadline: float):
    """Runs until a second after the search's time limit (a wall-clock deadline: the
    workers run on this machine), so no worker is free before it."""
    import time

    time.sleep(max(0.0, deadline + 1.0 - time.time()))
    return trial.suggest_float("x", 0, 1)


def scenario_tune(spark):
    """Single-node trials on Connect: one job of 2 long-lived tasks, shared data, a pruned
    and a failing trial; then the refusals, a timeout and a Ctrl-C."""
    import _thread
    import tempfile
    import threading

    import numpy as np
    import optuna

    import sparkdist.tune
    from sparkdist.errors import ConnectUnsupportedError

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    array = np.arange(1_000_000, dtype=np.float64)
    SHARED[:] = [sparkdist.tune.share(array)]
    RENDEZVOUS[:] = [tempfile.mkdtemp()]
    study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=1.2))
    study.enqueue_trial({"x": 0.9})  # pruned at step 0
    for x in (0.1, 0.15, 0.05, 0.12, 0.18):  # under the threshold from step 0
        study.enqueue_trial({"x": x})
    sparkdist.tune.optimize(study, tune_objective, n_trials=6, parallelism=2)
    out = {
        "states": [t.state.name for t in study.trials],
        "tasks": [t.user_attrs.get("task") for t in study.trials],
        "shared_sums": [t.user_attrs.get("shared_sum") for t in study.trials],
        "expected_sum": float(array.sum()),
        "failure": study.trials[2].user_attrs.get("traceback"),
        "best": study.best_value,
    }
    hinted = optuna.create_study()
    sparkdist.tune.optimize(hinted, uses_spark_context, n_trials=1)
    out["hint"] = hinted.trials[0].user_attrs["traceback"]
    try:
        sparkdist.tune.optimize(optuna.create_study(), lambda t: spark.range(1).count(), n_trials=1)
        out["session_error"] = None
    except ConnectUnsupportedError as exc:
        out["session_error"] = str(exc)
    os.environ["SPARKDIST_CONNECT_RELAY"] = "always"  # as if executors cannot reach us
    try:
        sparkdist.tune.optimize(optuna.create_study(), tune_objective, n_trials=1)
        out["unreachable_error"] = None
    except ConnectUnsupportedError as exc:
        out["unreachable_error"] = str(exc)
    finally:
        del os.environ["SPARKDIST_CONNECT_RELAY"]

    interrupted = optuna.create_study()

    def interrupt_when_both_run():
        while sum(t.user_attrs.get("started", False) for t in interrupted.get_trials()) < 2:
            time.sleep(0.2)
        _thread.interrupt_main()  # what Ctrl-C does

    threading.Thread(target=interrupt_when_both_run, daemon=True).start()
    started = time.monotonic()
    returned = sparkdist.tune.optimize(interrupted, sleeps_unless_first, n_trials=5)
    out["interrupt_s"] = time.monotonic() - started
    out["interrupt_returned"] = returned is interrupted
    out["interrupted"] = [t.state.name for t in interrupted.trials]
    out["interrupt_why"] = interrupted.trials[1].user_attrs.get("traceback")
    timed = optuna.create_study()
    deadline = time.time() + TIMED_LIMIT_S
    objective = functools.partial(sleeps_past_the_time_limit, deadline=deadline)
    sparkdist.tune.optimize(timed, objective, n_trials=20, timeout=TIMED_LIMIT_S)
    out["timed"] = [t.state.name for t in timed.trials]
    out["timed_started_late"] = [
        t.number for t in timed.trials if t.datetime_start.timestamp() > deadline
    ]
    return out


def ranks_objective(trial):
    """2 ranks: both read the shared value and get the same suggestion; rank 0 reports."""
    import os

    import torch
    import torch.distributed as dist

    lr = trial.suggest_float("lr", 1e-3, 1e-1, log=True)
    dist.init_process_group("gloo")
    value = torch.tensor([float(SHARED[0].value[int(os.environ["RANK"])]) + lr])
    dist.all_reduce(value)
    trial.report(value.item(), 0)
    dist.destroy_process_group()
    return value.item()


def scenario_tune_np2(spark):
    import optuna

    import sparkdist.tune

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    SHARED[:] = [sparkdist.tune.share([10.0, 20.0])]
    study = optuna.create_study()
    study.enqueue_trial({"lr": 0.01})
    sparkdist.tune.optimize(study, ranks_objective, n_trials=1, np=2)
    trial = study.trials[0]
    return {
        "state": trial.state.name,
        "value": trial.value,
        "steps": sorted(trial.intermediate_values),
    }


def report_steps(steps: int) -> int:
    """Every rank reports `steps` values; rank r's value at step s is 10 s + r."""
    import os

    import sparkdist

    rank = int(os.environ["RANK"])
    for step in range(steps):
        sparkdist.report({"v": 10.0 * step + rank}, step=step)
    return rank


def pruned_on_connect(trial):
    import sparkdist

    for step in range(50):
        sparkdist.report({"val_loss": 10.0 - step}, step=step)
    return 0.0


def scenario_report(spark):
    """sparkdist.report live (executors reach the client) into the client's MLflow run,
    then in relay mode (they do not: the reports come with the stage's output), then a
    distributed tune trial pruned by a reported value."""
    import mlflow
    import optuna

    import sparkdist.tune
    from sparkdist import HorovodRunner
    from sparkdist.spark.connect import RELAY_ENV

    def reported(runner):
        return [[e.rank, e.step, e.metrics["v"]] for e in runner.last_job.reported]

    out = {}
    with mlflow.start_run() as run:
        live = HorovodRunner(np=2, launcher="direct")
        live.run(report_steps, steps=3)
    history = mlflow.MlflowClient().get_metric_history(run.info.run_id, "v")
    out["live"] = reported(live)
    out["mlflow"] = [[m.step, m.value] for m in history]
    os.environ[RELAY_ENV] = "always"
    try:
        relayed = HorovodRunner(np=2, launcher="direct")
        relayed.run(report_steps, steps=3)
    finally:
        del os.environ[RELAY_ENV]
    out["relay"] = reported(relayed)
    out["relay_last"] = relayed.last_job.metrics

    class PruneFromStep2(optuna.pruners.BasePruner):
        def prune(self, study, trial):
            return trial.last_step is not None and trial.last_step >= 2

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(pruner=PruneFromStep2())
    sparkdist.tune.optimize(study, pruned_on_connect, n_trials=1, np=2)
    out["trial"] = [study.trials[0].state.name, sorted(study.trials[0].intermediate_values)]
    return out


def alive(runner) -> list[int]:
    """The pids of `helpers.still_alive`: the job's processes still running 15 s after it
    ended."""
    return [r.pid for r in still_alive(runner)]


def main() -> None:
    scenario = sys.argv[1]
    spark = connect()
    result = globals()[f"scenario_{scenario}"](spark)
    result["no_jvm"] = no_jvm()
    print("RESULT " + json.dumps(result), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
