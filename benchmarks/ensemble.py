"""Partition ensembles: parallel speedup, accuracy and task memory.

For generated data (scikit-learn's make_classification, 50 features) and K models:
  * sparkdist: PartitionEnsemble(XGBClassifier, n_estimators=K).fit on Spark, wall time
    from parquet on disk to fitted model on the driver (checks, shuffle, Arrow transfer,
    training, collect), and the part of it during which models were fitting;
  * sequential: the same estimator, K models one after another in this process on K
    random shares of the same rows held as numpy arrays (what the parallel map replaces);
    fit-only, and end to end from the same parquet file;
  * one model: a single XGBClassifier on all the training rows;
  * xgboost.spark: SparkXGBClassifier with num_workers=2 (the local cluster has 2 task
    slots, and barrier mode needs one slot per worker).
The machine may be shared, so each size runs `--repeats` rounds with the sequential and
sparkdist runs interleaved, and the table shows medians and the load average.
Accuracy is measured on held-out rows; "task peak" is the peak RSS of the Python worker
that trained a partition (max over tasks) and "partition" the feature bytes it held.

    .venv/bin/python benchmarks/ensemble.py            # 1e5 and 1e6 rows, K = 2, 8, 32
    .venv/bin/python benchmarks/ensemble.py --rows 10000000 --models 8 32 --repeats 1
    .venv/bin/python benchmarks/ensemble.py --quick    # small smoke run
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
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

import bench_table  # noqa: E402 (a sibling script, not a package)

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


class ChunkedClassification:
    """make_classification's recipe (2 classes, 2 clusters per class on hypercube vertices,
    20 informative features each cluster's own linear mix, 10 redundant mixes, 20 noise,
    2% flipped labels), generated a million rows at a time: 1e7 rows at once would need
    several GB of doubles on a shared 24 GB host."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.centroids = rng.choice([-1.0, 1.0], size=(4, 20))
        self.mixes = 2 * rng.random((4, 20, 20)) - 1
        self.redundant = 2 * rng.random((20, 10)) - 1
        self.seed = seed

    def rows(self, n_rows: int, part: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.seed, part])
        cluster = rng.integers(0, 4, n_rows)
        informative = rng.standard_normal((n_rows, 20))
        for c in range(4):
            chosen = cluster == c
            informative[chosen] = informative[chosen] @ self.mixes[c] + self.centroids[c]
        X = np.hstack(
            [informative, informative @ self.redundant, rng.standard_normal((n_rows, 20))]
        )
        y = cluster % 2
        flipped = rng.random(n_rows) < 0.02
        y[flipped] = rng.integers(0, 2, int(flipped.sum()))
        return X, y


def write_data(n_rows: int, path: str):
    """(feature columns, X_test, y_test, (X, y) or None): the training rows go to `path`;
    beyond 2e6 rows they are generated in chunks and not kept in memory."""
    if n_rows <= 2_000_000:
        X, y, X_test, y_test = make_data(n_rows)
        return write_parquet(X, y, path), X_test, y_test, (X, y)
    data = ChunkedClassification()
    columns = [f"f{i}" for i in range(N_FEATURES)]
    schema = pa.schema([(c, pa.float64()) for c in columns] + [("label", pa.float64())])
    with pq.ParquetWriter(path, schema) as writer:
        for part, start in enumerate(range(0, n_rows, 1_000_000)):
            X, y = data.rows(min(1_000_000, n_rows - start), part)
            arrays = [pa.array(X[:, i]) for i in range(N_FEATURES)] + [pa.array(y, pa.float64())]
            writer.write_table(pa.Table.from_arrays(arrays, schema=schema), row_group_size=50_000)
    X_test, y_test = data.rows(N_TEST, part=10**6)  # a part no training chunk uses
    return columns, X_test, y_test, None


def xgb_classifier():
    from xgboost import XGBClassifier

    return XGBClassifier(n_jobs=1, **XGB_PARAMS)


def timed(fn):
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def fit_span(stats: pd.DataFrame) -> float:
    """Wall seconds during which at least one model was fitting (union of fit intervals)."""
    ends = stats["fit_started"] + stats["fit_seconds"]
    intervals = sorted(zip(stats["fit_started"], ends, strict=True))
    total, end = 0.0, float("-inf")
    for start, stop in intervals:
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def phases(model, stats: pd.DataFrame, e2e_seconds: float) -> dict:
    """Where sparkdist's end-to-end seconds went, in order; they add up to e2e_seconds.

    checks: parameter and schema checks and planning, on the driver (the data's checks and
    class discovery ride on the spread); spread: from submitting the training job to the
    first training task starting (reading the source, cutting it into chunks, the shuffle
    write, scheduling); load: until the first model
    started fitting (shuffle read, Arrow transfer, building the matrix); fit: the union of
    the fit intervals; gaps: moments inside the training job with no fit running (later
    tasks loading, serializing); tail: last fit's end to the end of fit (serializing the
    last models, collect, assembling the model on the driver).
    """
    timings = model.fit_timings_
    job_start = timings["training_job_started"]
    first_task = float(stats["task_started"].min()) - job_start
    first_fit = float(stats["fit_started"].min()) - job_start
    last_fit_end = float((stats["fit_started"] + stats["fit_seconds"]).max()) - job_start
    fit = fit_span(stats)
    return {
        "ph_checks": timings["checks_seconds"],
        "ph_spread": first_task,
        "ph_load": first_fit - first_task,
        "ph_fit": fit,
        "ph_gaps": last_fit_end - first_fit - fit,
        "ph_tail": e2e_seconds - timings["checks_seconds"] - last_fit_end,
        "rss_before_mb": float(stats["worker_rss_before_bytes"].max()) / 2**20,
        "load_growth_x": float(
            (
                (stats["worker_peak_rss_loaded_bytes"] - stats["worker_rss_before_bytes"])
                / stats["partition_bytes"]
            ).max()
        ),
        "model_growth_x": float(
            (
                (stats["worker_peak_rss_bytes"] - stats["worker_rss_before_bytes"])
                / stats["partition_bytes"]
            ).max()
        ),
        "task_growth_x": task_growth(stats),
    }


def task_growth(stats: pd.DataFrame) -> float:
    """The issue's measure, max over training tasks: the task's peak RSS above its worker's
    RSS before it received rows, over the bytes of all the rows it received (each model's
    peak is measured from that model's start, so the task's peak is the largest of them)."""
    tasks = stats.groupby(["partition_id", "task_started"])
    growth = (
        tasks["worker_peak_rss_bytes"].max() - tasks["worker_rss_before_bytes"].min()
    ) / tasks["partition_bytes"].sum()
    return float(growth.max())


PLAIN_FIT = """
import sys, numpy as np
from xgboost import XGBClassifier
def status(key):
    return next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith(key))
rng = np.random.default_rng(0)
X = rng.standard_normal((int(sys.argv[1]), %d), dtype=np.float32)
y = (X[:, :5].sum(axis=1) + rng.standard_normal(len(X)) > 0).astype(np.int32)
open('/proc/self/clear_refs', 'w').write('5')
before = status('VmRSS')
XGBClassifier(n_jobs=1, **%r).fit(X, y)
print((status('VmHWM') - before) / (X.nbytes + y.nbytes))
"""


def plain_fit_growth(n_rows: int) -> float:
    """XGBoost's own working memory on one model's rows: a fresh process that already holds
    n_rows x 50 float32 fits one model; its peak RSS growth over the rows' bytes."""
    code = PLAIN_FIT % (N_FEATURES, XGB_PARAMS)
    done = subprocess.run(
        [sys.executable, "-c", code, str(n_rows)], capture_output=True, text=True, check=True
    )
    return float(done.stdout.split()[-1])


def sequential_models(path: str, X_test, y_test, k: int, seed: int) -> dict:
    """The K models one after another in this process, on K random shares of the rows.

    fit-only: the shares are numpy arrays already in memory; end to end adds reading the
    parquet file into numpy and cutting the shares, as the Spark run starts from the file.
    """
    started = time.perf_counter()
    table = pq.read_table(path)
    # float32, as XGBoost trains on it (and as sparkdist ships it): half the memory at 1e7.
    X_read = np.empty((table.num_rows, table.num_columns - 1), dtype=np.float32)
    for i, name in enumerate(table.column_names[:-1]):
        X_read[:, i] = table.column(name).to_numpy()
    y_read = table.column("label").to_numpy()
    del table
    share = np.random.default_rng(seed).integers(0, k, size=len(y_read))
    shares = [(X_read[share == j], y_read[share == j]) for j in range(k)]
    del X_read, y_read
    read_seconds = time.perf_counter() - started

    started_cpu = time.process_time()
    models, fit_seconds = timed(lambda: [xgb_classifier().fit(Xj, yj) for Xj, yj in shares])
    cpu_seconds = time.process_time() - started_cpu
    proba = np.mean([m.predict_proba(X_test) for m in models], axis=0)
    return {
        "seq_fit_s": fit_seconds,
        "seq_e2e_s": read_seconds + fit_seconds,
        "seq_cpu_s": cpu_seconds,
        "seq_acc": float((np.argmax(proba, axis=1) == y_test).mean()),
    }


def sparkdist_models(df, columns: list[str], X_test, y_test, k: int, mode: str) -> dict:
    """PartitionEnsemble.fit from the parquet file to the fitted model on the driver, in
    one of MODES."""
    from sparkdist.ensemble import PartitionEnsemble
    from sparkdist.ensemble.fit import partitioning

    shuffle = mode != "no shuffle"
    ensemble = PartitionEnsemble(xgb_classifier(), n_estimators=k, random_state=k, shuffle=shuffle)
    readers = partitioning.MAX_READERS_IN_PLACE
    if mode == "spread":  # the route is chosen on the driver: Spark's shuffle for any K
        partitioning.MAX_READERS_IN_PLACE = 0
    try:
        model, seconds = timed(lambda: ensemble.fit(df, features_col=columns))
    finally:
        partitioning.MAX_READERS_IN_PLACE = readers
    stats = model.stats_frame()
    return {
        "spark_e2e_s": seconds,
        "spark_fit_s": fit_span(stats),
        **phases(model, stats, seconds),
        "fit_cpu_sum": float(stats["fit_cpu_seconds"].sum()),
        "fit_wall_sum": float(stats["fit_seconds"].sum()),
        "load_s_max": float(stats["load_seconds"].max()),
        "spark_acc": model.score(X_test, y_test),
        "task_peak_mb": stats["worker_peak_rss_bytes"].max() / 2**20,
        "partition_mb": stats["partition_bytes"].max() / 2**20,
    }


def xgboost_spark(df, columns: list[str], X_test, y_test) -> dict:
    from xgboost.spark import SparkXGBClassifier

    estimator = SparkXGBClassifier(
        features_col=columns, label_col="label", num_workers=SPARK_WORKERS, **XGB_PARAMS
    )
    fitted, seconds = timed(lambda: estimator.fit(df))
    predicted = fitted.get_booster().inplace_predict(X_test) > 0.5
    return {"xgb_spark_s": seconds, "xgb_spark_acc": float((predicted == y_test).mean())}


def run_size(
    spark, n_rows: int, ks: list[int], repeats: int, workdir: str, modes: list[str]
) -> list[dict]:
    """Rounds of (sequential, sparkdist) per K plus xgboost.spark, interleaved; medians.

    Beyond 2e6 rows one model on all rows and xgboost.spark are not run (single-threaded
    minutes, and several GB on a shared host); their columns show nan.
    """
    path = os.path.join(workdir, f"train-{n_rows}.parquet")
    columns, X_test, y_test, train = write_data(n_rows, path)
    df = spark.read.parquet(path)

    one_accuracy = float("nan")
    if train is not None:
        one, one_seconds = timed(lambda: xgb_classifier().fit(*train))
        one_accuracy = float((one.predict(X_test) == y_test).mean())
        log(f"{n_rows} rows: one model {one_seconds:.1f}s, accuracy {one_accuracy:.4f}")

    samples: dict[tuple[int, str], list[dict]] = {(k, m): [] for k in ks for m in modes}
    xgb_samples = []
    for round_ in range(repeats):
        for k in ks:
            sequential = sequential_models(path, X_test, y_test, k, seed=k)
            for mode in modes:
                warm_workers(spark)
                sample = {"load1": os.getloadavg()[0], **sequential}
                sample |= sparkdist_models(df, columns, X_test, y_test, k, mode)
                log(
                    f"{n_rows} rows, K={k}, {mode}, round {round_ + 1}: sequential "
                    f"fit {sample['seq_fit_s']:.1f}s, sparkdist {sample['spark_e2e_s']:.1f}s end "
                    f"to end ({sample['spark_fit_s']:.1f}s fitting), load {sample['load1']:.1f}; "
                    + ", ".join(f"{key} {sample[key]:.2f}" for key in [*PHASES, *GROWTH])
                )
                samples[k, mode].append(sample)
        if n_rows <= 2_000_000:
            xgb_samples.append(xgboost_spark(df, columns, X_test, y_test))
            log(f"{n_rows} rows: xgboost.spark {xgb_samples[-1]['xgb_spark_s']:.1f}s")
        else:
            xgb_samples.append({"xgb_spark_s": float("nan"), "xgb_spark_acc": float("nan")})

    xgb = pd.DataFrame(xgb_samples).median()
    alone = {k: plain_fit_growth(n_rows // k) for k in ks}
    results = []
    for (k, mode), k_samples in samples.items():
        median = pd.DataFrame(k_samples).median()
        results.append(result_row(n_rows, k, mode, median, xgb, one_accuracy, alone[k]))
    return results


def result_row(
    n_rows: int,
    k: int,
    mode: str,
    median: pd.Series,
    xgb: pd.Series,
    one_accuracy: float,
    alone: float,
) -> dict:
    """One row of the table: a (K, mode)'s medians over the rounds."""
    return {
        "rows": n_rows,
        "K": k,
        "mode": mode,
        "seq_fit_s": median["seq_fit_s"],
        "spark_fit_s": median["spark_fit_s"],
        "fit_speedup": median["seq_fit_s"] / median["spark_fit_s"],
        "seq_e2e_s": median["seq_e2e_s"],
        "spark_e2e_s": median["spark_e2e_s"],
        "e2e_speedup": median["seq_e2e_s"] / median["spark_e2e_s"],
        "fit_cpu_sum": median["fit_cpu_sum"],
        "seq_cpu_s": median["seq_cpu_s"],
        "load_s_max": median["load_s_max"],
        "spark_acc": median["spark_acc"],
        "seq_acc": median["seq_acc"],
        "one_model_acc": one_accuracy,
        "xgb_spark_s": xgb["xgb_spark_s"],
        "xgb_spark_acc": xgb["xgb_spark_acc"],
        "task_peak_mb": median["task_peak_mb"],
        "rss_before_mb": median["rss_before_mb"],
        "load_growth_x": median["load_growth_x"],
        "task_growth_x": median["task_growth_x"],
        "model_growth_x": median["model_growth_x"],
        "xgb_alone_x": alone,
        **{key: median[key] for key in PHASES},
        "partition_mb": median["partition_mb"],
        "load1": median["load1"],
    }


def warm_up(spark, workdir: str, ks: list[int]) -> None:
    """Start the executors' Python workers, import the libraries, let the JVMs compile
    the read and shuffle paths (a fit read in place, one through Spark's shuffle), and
    find each K's partition keys (one small Spark job per K, once per process) before
    any timing. The first fit of a fresh session pays that
    once: 4-7 s more at 1e6 rows with a 2,000-row warm-up, measured."""
    from sparkdist.ensemble.fit.partitioning import partition_keys

    X, y, _, _ = make_data(100_000)
    path = os.path.join(workdir, "warm-up.parquet")
    columns = write_parquet(X, y, path)
    df = spark.read.parquet(path)
    for mode in ("default", "spread"):  # read in place, and through Spark's shuffle
        sparkdist_models(df, columns, X[:N_TEST], y[:N_TEST], 2, mode)
    for k in ks:
        partition_keys(spark, k)


def _import_models(batches):
    import xgboost  # noqa: F401

    yield from batches


def warm_workers(spark) -> None:
    """Give every executor a running Python worker that imported XGBoost, just before a
    timed fit. Spark stops a worker after a minute idle, and under load the sequential
    fits take longer: the first fit after them paid new workers (spread 9.9 s against
    0.2-0.5 s warm at load 10), whichever mode came first."""
    spark.range(0, SPARK_WORKERS, 1, SPARK_WORKERS).mapInArrow(_import_models, "id long").collect()


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# "default": PartitionEnsemble(shuffle=True), the random spread of all rows (read in place
# where it applies); "no shuffle": shuffle=False (each task spreads the rows it read over
# its own models); "spread" (with --spread): shuffle=True always through Spark's shuffle.
MODES = ("default", "no shuffle")
GROWTH = ["load_growth_x", "model_growth_x", "task_growth_x"]
PHASES = ["ph_checks", "ph_spread", "ph_load", "ph_fit", "ph_gaps", "ph_tail"]


def print_table(results: list[dict], repeats: int) -> None:
    table = pd.DataFrame(results)
    breakdown = table[["rows", "K", "mode", "spark_e2e_s", *PHASES]].copy()
    main_columns = [c for c in table.columns if c not in PHASES]
    table = table[main_columns]
    formats = {
        "seq_fit_s": "{:.1f}",
        "spark_fit_s": "{:.1f}",
        "fit_speedup": "{:.2f}x",
        "seq_e2e_s": "{:.1f}",
        "spark_e2e_s": "{:.1f}",
        "e2e_speedup": "{:.2f}x",
        "fit_cpu_sum": "{:.1f}",
        "seq_cpu_s": "{:.1f}",
        "load_s_max": "{:.1f}",
        "spark_acc": "{:.4f}",
        "seq_acc": "{:.4f}",
        "one_model_acc": "{:.4f}",
        "xgb_spark_s": "{:.1f}",
        "xgb_spark_acc": "{:.4f}",
        "task_peak_mb": "{:.0f}",
        "rss_before_mb": "{:.0f}",
        "load_growth_x": "{:.2f}x",
        "task_growth_x": "{:.2f}x",
        "model_growth_x": "{:.2f}x",
        "xgb_alone_x": "{:.2f}x",
        "partition_mb": "{:.1f}",
        "load1": "{:.1f}",
    }
    for column, fmt in formats.items():
        table[column] = table[column].map(fmt.format)
    title = f"medians of {repeats} interleaved round(s); {os.cpu_count()} cores"
    print(title)
    cells = table.values.tolist()
    text = table.to_string(index=False)
    bench_table.print_table("ensembles", title, list(table.columns), cells, text=text)
    print()
    title = "where sparkdist's end-to-end seconds went (medians; see phases())"
    print(title)
    for column in ["spark_e2e_s", *PHASES]:
        breakdown[column] = breakdown[column].map("{:.2f}".format)
    cells, text = breakdown.values.tolist(), breakdown.to_string(index=False)
    bench_table.print_table("phases", title, list(breakdown.columns), cells, text=text)
    print()
    for note in NOTES:
        print(note)


NOTES = [
    "seq_fit_s: the K models one after another in one process, numpy data in memory",
    "spark_fit_s: wall seconds during which some sparkdist task was fitting a model",
    "fit_speedup: seq_fit_s / spark_fit_s (the parallel map itself; 2 task slots)",
    "seq_e2e_s: seq_fit_s plus reading the parquet file into numpy and cutting the shares",
    "mode: default is PartitionEnsemble(shuffle=True), all rows spread at random over all",
    "  models: a plain Parquet scan with K <= slots (and K <= 4) is read in place by each",
    "  model's task, otherwise through Spark's shuffle; no shuffle is shuffle=False (rows",
    "  stay in the task that read them); spread (--spread) is shuffle=True through Spark's",
    "  shuffle at any K (the default's route before the in-place read)",
    "spark_e2e_s: PartitionEnsemble.fit from the parquet file to the fitted model on the driver",
    "  (read and spread with checks, shuffle, fitting, collect); e2e_speedup = seq/spark",
    "fit_cpu_sum / seq_cpu_s: CPU seconds of the K fits on the executors / in sequence",
    "  (CPU well below spark_fit_s x 2 means the tasks waited for a core: a busy host)",
    "load_s_max: the longest a task spent receiving its rows and building its matrix",
    "xgb_spark: SparkXGBClassifier(num_workers=2) on the same rows (2 slots for barrier mode)",
    "task_peak_mb: peak RSS of the Python worker while it trained a partition (max over tasks)",
    "rss_before_mb: the worker's RSS before it received rows; task_growth_x: the task's",
    "  (peak - before) / the bytes of all its rows (the issue's measure; max over tasks)",
    "model_growth_x: the same for one model: (peak while it loaded and fitted - RSS before its",
    "  rows) / its rows' bytes; load_growth_x: the same at the end of its loading, before the",
    "  fit (the rest of the growth is the estimator's own working memory)",
    "  (with shuffle=False a task holds all its models' rows at once: load_growth_x and",
    "  model_growth_x are not meaningful there, task_growth_x is)",
    "xgb_alone_x: that working memory alone: a fresh process holding one model's rows (float32)",
    "  fits one model; its peak RSS growth / the rows' bytes",
    "ph_*: checks (driver), spread (source read, chunks, shuffle write; read in place or",
    "  without a shuffle only the job's start), load (to the first fit: the rows' reading),",
    "  fit (fit window), gaps (no fit running inside the job), tail (serialize, collect, assemble)",
    "partition_mb: feature and label bytes of one model's rows (float32 features for XGBoost)",
    "load1: the host's 1-minute load average when the round started",
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
    parser.add_argument(
        "--spread",
        action="store_true",
        help="also run shuffle=True through Spark's shuffle at every K (mode 'spread')",
    )
    parser.add_argument(
        "--repeats", type=int, help="interleaved rounds per size, medians reported (default 3)"
    )
    args = parser.parse_args()
    rows = args.rows or ([20_000] if args.quick else [100_000, 1_000_000])
    ks = args.models or ([2, 8] if args.quick else [2, 8, 32])
    repeats = args.repeats or (1 if args.quick else 3)
    modes = [*MODES, "spread"] if args.spread else list(MODES)
    logging.basicConfig(level=logging.WARNING)

    workdir = tempfile.mkdtemp(prefix="sparkdist-bench-")
    spark = build_spark(args.master)
    try:
        warm_up(spark, workdir, ks)
        results = []
        for n_rows in rows:
            results += run_size(spark, n_rows, ks, repeats, workdir, modes)
        print_table(results, repeats)
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
