"""Partition ensembles: parallel speedup, accuracy and task memory.

For generated data (scikit-learn's make_classification, 50 features) and K models:
  * sparkdist: PartitionEnsemble(XGBClassifier, n_estimators=K).fit on Spark, wall time
    from parquet on disk to fitted model on the driver (validation, shuffle, training);
  * sequential: the same K models trained one after another in this process on K random
    shares of the same rows (what the parallel map replaces);
  * one model: a single XGBClassifier on all the training rows;
  * xgboost.spark: SparkXGBClassifier with num_workers=2 (the local cluster has 2 task
    slots, and barrier mode needs one slot per worker).
Accuracy is measured on held-out rows; "task peak" is the peak RSS of the Python worker
that trained a partition (max over tasks) and "partition" the feature bytes it held.

    .venv/bin/python benchmarks/ensemble.py            # 1e5 and 1e6 rows, K = 2, 8, 32
    .venv/bin/python benchmarks/ensemble.py --quick    # small smoke run
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# Executors import sparkdist; make the source tree importable when it is not installed.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)
sys.path.insert(0, _ROOT)

N_FEATURES = 50
N_TEST = 20_000
SPARK_WORKERS = 2
XGB_PARAMS = {"n_estimators": 100, "max_depth": 6, "learning_rate": 0.3, "tree_method": "hist"}


def build_spark(master: str):
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .appName("sparkdist-bench-ensemble")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.executor.memory", "2g")
        .config("spark.sql.shuffle.partitions", "8")
        # Split the parquet input so that both task slots read it.
        .config("spark.sql.files.maxPartitionBytes", str(16 * 2**20))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def make_data(n_rows: int, seed: int = 0):
    from sklearn.datasets import make_classification

    X, y = make_classification(
        n_samples=n_rows + N_TEST,
        n_features=N_FEATURES,
        n_informative=20,
        n_redundant=10,
        flip_y=0.02,
        random_state=seed,
    )
    return X[:n_rows], y[:n_rows], X[n_rows:], y[n_rows:]


def write_parquet(X: np.ndarray, y: np.ndarray, path: str) -> list[str]:
    columns = [f"f{i}" for i in range(X.shape[1])]
    table = pa.table({**{c: X[:, i] for i, c in enumerate(columns)}, "label": y.astype("f8")})
    pq.write_table(table, path, row_group_size=50_000)
    return columns


def xgb_classifier():
    from xgboost import XGBClassifier

    return XGBClassifier(n_jobs=1, **XGB_PARAMS)


def timed(fn):
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def sequential_models(X, y, X_test, k: int, seed: int):
    """Train K models one after another on K random shares.

    Returns (test predictions, wall seconds, CPU seconds).
    """
    share = np.random.default_rng(seed).integers(0, k, size=len(y))

    def train():
        return [xgb_classifier().fit(X[share == j], y[share == j]) for j in range(k)]

    started_cpu = time.process_time()
    models, seconds = timed(train)
    cpu_seconds = time.process_time() - started_cpu
    proba = np.mean([m.predict_proba(X_test) for m in models], axis=0)
    return np.argmax(proba, axis=1), seconds, cpu_seconds


def run_size(spark, n_rows: int, ks: list[int], workdir: str) -> list[dict]:
    from xgboost.spark import SparkXGBClassifier

    from sparkdist.ensemble import PartitionEnsemble

    X, y, X_test, y_test = make_data(n_rows)
    path = os.path.join(workdir, f"train-{n_rows}.parquet")
    columns = write_parquet(X, y, path)
    df = spark.read.parquet(path)

    one, one_seconds = timed(lambda: xgb_classifier().fit(X, y))
    one_accuracy = float((one.predict(X_test) == y_test).mean())
    log(f"{n_rows} rows: one model {one_seconds:.1f}s, accuracy {one_accuracy:.4f}")

    spark_xgb = SparkXGBClassifier(
        features_col=columns, label_col="label", num_workers=SPARK_WORKERS, **XGB_PARAMS
    )
    fitted_xgb, xgb_seconds = timed(lambda: spark_xgb.fit(df))
    xgb_pred = fitted_xgb.get_booster().inplace_predict(X_test) > 0.5
    xgb_accuracy = float((xgb_pred.astype(int) == y_test).mean())
    log(f"{n_rows} rows: xgboost.spark {xgb_seconds:.1f}s, accuracy {xgb_accuracy:.4f}")

    results = []
    for k in ks:
        predicted, sequential_seconds, sequential_cpu = sequential_models(X, y, X_test, k, seed=k)
        sequential_accuracy = float((predicted == y_test).mean())
        ensemble = PartitionEnsemble(xgb_classifier(), n_estimators=k, random_state=k)
        model, seconds = timed(lambda ensemble=ensemble: ensemble.fit(df, features_col=columns))
        stats = model.stats_frame()
        row = {
            "rows": n_rows,
            "K": k,
            "sequential_s": sequential_seconds,
            "sparkdist_s": seconds,
            "speedup": sequential_seconds / seconds,
            "fit_s_sum": float(stats["fit_seconds"].sum()),
            "fit_cpu_sum": float(stats["fit_cpu_seconds"].sum()),
            "sequential_cpu": sequential_cpu,
            "sparkdist_acc": model.score(X_test, y_test),
            "sequential_acc": sequential_accuracy,
            "one_model_acc": one_accuracy,
            "one_model_s": one_seconds,
            "xgb_spark_s": xgb_seconds,
            "xgb_spark_acc": xgb_accuracy,
            "task_peak_mb": stats["worker_peak_rss_bytes"].max() / 2**20,
            "partition_mb": stats["partition_bytes"].max() / 2**20,
        }
        log(
            f"{n_rows} rows, K={k}: sequential {sequential_seconds:.1f}s, sparkdist "
            f"{seconds:.1f}s ({row['speedup']:.2f}x), accuracy {row['sparkdist_acc']:.4f}"
        )
        results.append(row)
    return results


def warm_up(spark, workdir: str) -> None:
    """Start the executors' Python workers and import the libraries before any timing."""
    from sparkdist.ensemble import PartitionEnsemble

    X, y, _, _ = make_data(2_000)
    path = os.path.join(workdir, "warm-up.parquet")
    columns = write_parquet(X, y, path)
    PartitionEnsemble(xgb_classifier(), n_estimators=2, random_state=0).fit(
        spark.read.parquet(path), features_col=columns
    )


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def print_table(results: list[dict]) -> None:
    table = pd.DataFrame(results)
    formats = {
        "sequential_s": "{:.1f}",
        "sparkdist_s": "{:.1f}",
        "speedup": "{:.2f}x",
        "fit_s_sum": "{:.1f}",
        "fit_cpu_sum": "{:.1f}",
        "sequential_cpu": "{:.1f}",
        "sparkdist_acc": "{:.4f}",
        "sequential_acc": "{:.4f}",
        "one_model_acc": "{:.4f}",
        "one_model_s": "{:.1f}",
        "xgb_spark_s": "{:.1f}",
        "xgb_spark_acc": "{:.4f}",
        "task_peak_mb": "{:.0f}",
        "partition_mb": "{:.1f}",
    }
    for column, fmt in formats.items():
        table[column] = table[column].map(fmt.format)
    print(table.to_string(index=False))
    print()
    for note in NOTES:
        print(note)


NOTES = [
    "sequential_s: the K models one after another in one process (sequential_cpu: its CPU s)",
    "sparkdist_s: PartitionEnsemble.fit from parquet to fitted model, 2 task slots",
    "speedup: sequential_s / sparkdist_s",
    "fit_s_sum / fit_cpu_sum: the K models' own fit wall / CPU seconds on the executors",
    "  (CPU well below wall means the tasks waited for a core: a busy host)",
    "xgb_spark: SparkXGBClassifier(num_workers=2) on the same rows (2 slots for barrier mode)",
    "task_peak_mb: peak RSS of the Python worker that trained a partition (max over tasks)",
    "partition_mb: feature and label bytes one task held",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    parser.add_argument("--rows", type=int, nargs="+", help="row counts (default 1e5 1e6)")
    parser.add_argument("--models", type=int, nargs="+", help="K values (default 2 8 32)")
    parser.add_argument(
        "--master",
        default=os.environ.get("SPARKDIST_BENCH_MASTER", "local-cluster[2,1,2048]"),
        help="Spark master (default: two executors with one core each)",
    )
    args = parser.parse_args()
    rows = args.rows or ([20_000] if args.quick else [100_000, 1_000_000])
    ks = args.models or ([2, 8] if args.quick else [2, 8, 32])
    logging.basicConfig(level=logging.WARNING)

    workdir = tempfile.mkdtemp(prefix="sparkdist-bench-")
    spark = build_spark(args.master)
    try:
        warm_up(spark, workdir)
        results = []
        for n_rows in rows:
            results += run_size(spark, n_rows, ks, workdir)
        print_table(results)
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
