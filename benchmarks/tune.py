"""Parallel trials: sparkdist.tune against the peers, same objective, same number of trials.

Part 1, single-node trials (local-cluster[2,1,1024], 2 task slots): 16 XGBoost trials on
one dataset, 2 at once,
  * sparkdist: `sparkdist.tune.optimize(study, objective, n_trials=16, parallelism=2)` with
    Optuna's TPE sampler (seed 0), the data shared with `sparkdist.tune.share` (2
    long-lived worker tasks pull the 16 trials);
  * Hyperopt: `fmin(..., algo=tpe.suggest, trials=SparkTrials(parallelism=2))`, the same
    search space (Hyperopt's TPE, seed 0), the data a broadcast variable (a Spark job
    per trial).
Part 2, distributed trials (local-cluster[2,2,1024], 4 slots): 4 trials of a 2-rank torch
DDP training on scikit-learn's digits, with the same 4 learning rates,
  * sparkdist: `optimize(..., np=2)` with the 4 trials queued, 2 at once;
  * TorchDistributor: pyspark's `TorchDistributor(num_processes=2, local_mode=False)`, the
    4 trials one after another (a trial's TorchDistributor job blocks its caller).
Wall time from the first trial asked to the last told, best value found. Each part runs in
its own process (one SparkContext per process) and the table shows both with the load.

    .venv/bin/python benchmarks/tune.py
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)
sys.path.insert(0, _ROOT)

import bench_table  # noqa: E402 (a sibling script, not a package)

N_SINGLE = 16
LEARNING_RATES = [0.03, 0.01, 0.003, 0.001]


def build_spark(master: str):
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(master)
        .appName("sparkdist-bench-tune")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )


def xgb_loss(data, n_estimators: int, max_depth: int, learning_rate: float, subsample: float):
    from sklearn.metrics import log_loss
    from xgboost import XGBClassifier

    x_train, x_valid, y_train, y_valid = data.value
    model = XGBClassifier(
        n_estimators=n_estimators,
        max_depth=max_depth,
        learning_rate=learning_rate,
        subsample=subsample,
        n_jobs=1,
    )
    model.fit(x_train, y_train)
    return float(log_loss(y_valid, model.predict_proba(x_valid)))


def single_node_part() -> list[dict]:
    import numpy as np
    import optuna
    from hyperopt import SparkTrials, fmin, hp, tpe
    from sklearn.datasets import make_classification
    from sklearn.model_selection import train_test_split

    import sparkdist.tune

    spark = build_spark("local-cluster[2,1,1024]")
    sc = spark.sparkContext
    x, y = make_classification(n_samples=20_000, n_features=30, n_informative=12, random_state=0)
    split = train_test_split(x, y, test_size=0.25, random_state=0)
    data = sc.broadcast(split)
    sc.parallelize(range(4), 4).map(lambda i: len(data.value)).collect()  # warm workers
    shared = sparkdist.tune.share(split)

    def objective(trial):
        return xgb_loss(
            shared,
            trial.suggest_int("n_estimators", 20, 200, log=True),
            trial.suggest_int("max_depth", 2, 8),
            trial.suggest_float("learning_rate", 0.01, 0.5, log=True),
            trial.suggest_float("subsample", 0.5, 1.0),
        )

    rows = []
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0))
    start = time.monotonic()
    sparkdist.tune.optimize(study, objective, n_trials=N_SINGLE, parallelism=2)
    rows.append(
        {
            "part": "16 XGBoost trials, 2 slots",
            "tool": "sparkdist.tune (Optuna TPE)",
            "wall_s": time.monotonic() - start,
            "best": study.best_value,
            "done": sum(t.state.name == "COMPLETE" for t in study.trials),
        }
    )

    space = {
        "n_estimators": hp.qloguniform("n_estimators", np.log(20), np.log(200), 1),
        "max_depth": hp.quniform("max_depth", 2, 8, 1),
        "learning_rate": hp.loguniform("learning_rate", np.log(0.01), np.log(0.5)),
        "subsample": hp.uniform("subsample", 0.5, 1.0),
    }

    def hyperopt_objective(p):
        return xgb_loss(
            data, int(p["n_estimators"]), int(p["max_depth"]), p["learning_rate"], p["subsample"]
        )

    trials = SparkTrials(parallelism=2, spark_session=spark)
    start = time.monotonic()
    fmin(
        hyperopt_objective,
        space,
        algo=tpe.suggest,
        max_evals=N_SINGLE,
        trials=trials,
        rstate=np.random.default_rng(0),
        show_progressbar=False,
    )
    rows.append(
        {
            "part": "16 XGBoost trials, 2 slots",
            "tool": "Hyperopt SparkTrials (TPE)",
            "wall_s": time.monotonic() - start,
            "best": min(trials.losses()),
            "done": sum(loss is not None for loss in trials.losses()),
        }
    )
    spark.stop()
    return rows


def ddp_train(lr: float) -> float:
    """3 epochs of the digits DDP demo over Gloo; every rank returns the test accuracy."""
    from sparkdist.demos.digits import train_digits_ddp

    return train_digits_ddp(epochs=3, lr=lr)["accuracy"]


def distributed_part() -> list[dict]:
    import optuna
    from pyspark.ml.torch.distributor import TorchDistributor

    import sparkdist.tune

    spark = build_spark("local-cluster[2,2,1024]")
    spark.sparkContext.parallelize(range(4), 4).count()  # executors up

    def objective(trial):
        return ddp_train(trial.suggest_float("lr", 1e-4, 0.1, log=True))

    rows = []
    study = optuna.create_study(direction="maximize")
    for lr in LEARNING_RATES:
        study.enqueue_trial({"lr": lr})
    start = time.monotonic()
    sparkdist.tune.optimize(study, objective, n_trials=len(LEARNING_RATES), np=2, parallelism=2)
    rows.append(
        {
            "part": "4 DDP trials of 2 ranks, 4 slots",
            "tool": "sparkdist.tune np=2 (2 at once)",
            "wall_s": time.monotonic() - start,
            "best": study.best_value,
            "done": sum(t.state.name == "COMPLETE" for t in study.trials),
        }
    )

    start = time.monotonic()
    values = [
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(ddp_train, lr)
        for lr in LEARNING_RATES
    ]
    rows.append(
        {
            "part": "4 DDP trials of 2 ranks, 4 slots",
            "tool": "TorchDistributor, one by one",
            "wall_s": time.monotonic() - start,
            "best": max(values),
            "done": len(values),
        }
    )
    spark.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["single", "distributed"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.part:
        rows = single_node_part() if args.part == "single" else distributed_part()
        print("ROWS " + json.dumps(rows), flush=True)
        return
    rows = []
    for part in ("single", "distributed"):
        out = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--part", part],
            stdout=subprocess.PIPE,
            text=True,
            check=True,
        ).stdout
        rows += json.loads(next(line for line in out.splitlines() if line.startswith("ROWS "))[5:])
    title = f"load average: {os.getloadavg()[0]:.1f} (1 min), {os.cpu_count()} cores"
    lines = [f"\n{title}", f"{'part':34} {'tool':34} {'wall s':>7} {'best':>8} {'trials done':>11}"]
    for r in rows:
        lines.append(
            f"{r['part']:34} {r['tool']:34} {r['wall_s']:7.1f} {r['best']:8.4f} {r['done']:11d}"
        )
    columns = ["part", "tool", "wall s", "best", "trials done"]
    cells = [[r["part"], r["tool"], r["wall_s"], r["best"], r["done"]] for r in rows]
    bench_table.print_table("trials", title, columns, cells, text="\n".join(lines))


if __name__ == "__main__":
    main()
