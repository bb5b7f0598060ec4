"""The partition-wise training function: one partition's chunks in, one fitted model out.

It runs on the executors inside `mapInArrow`, after the spread (see partitioning): each
chunk of rows is copied once into the model's feature matrix, which grows in place (a
task's memory grows with its partition, never with the data set). The source tasks'
reports give the whole data's totals, which are checked before anything is fitted. One
model is fitted per model index found (normally exactly one), and each yields a single
row: the model as bytes, its statistics and the totals. Only those rows reach the driver.

A shuffle read in place (`train_in_place`) has no spread stage: each task reads every
row, keeps its model's and counts and checks them all, so its report is the totals.

Without a shuffle (`train_own_rows`), a task reads its own part of the data instead,
spreads it over its own models and checks only that part; the driver checks the totals.
"""

from __future__ import annotations

import json
import logging
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from sparkdist.ensemble.fit.parquet_source import ParquetSource
from sparkdist.ensemble.fit.partitioning import (
    SpreadPlan,
    file_pieces,
    read_chunks,
    spark_pieces,
    split_pieces,
)
from sparkdist.ensemble.fit.validation import DataReport, DataSummary, summarize
from sparkdist.ensemble.model.features import FeatureSpec
from sparkdist.ensemble.model.serialization import dump_estimator, library_versions
from sparkdist.ensemble.model.stats import EstimatorStats
from sparkdist.ensemble.params import Settings
from sparkdist.spark.task import partition_id, task_cpus

logger = logging.getLogger(__name__)

# One training task's result rows: (name, Spark SQL type, Arrow type) of each column. A
# task that trains nothing (bad data, or an empty partition) yields one row with model
# index -1 and only the report.
_RESULT_COLUMNS = (
    ("model_index", "int", pa.int32()),
    ("model_format", "string", pa.string()),
    ("model_class", "string", pa.string()),
    ("model_bytes", "binary", pa.binary()),
    ("stats", "string", pa.string()),
    ("report", "string", pa.string()),
)
RESULT_SCHEMA = ", ".join(f"{name} {sql_type}" for name, sql_type, _ in _RESULT_COLUMNS)
_RESULT_ARROW_SCHEMA = pa.schema([(name, arrow_type) for name, _, arrow_type in _RESULT_COLUMNS])


@dataclass(frozen=True)
class TrainingPlan:
    """Everything a training task needs; shipped to the executors in the task closure."""

    settings: Settings  # the checked parameters: the estimator, the seed drawn, ...
    features: FeatureSpec  # n_features 0 for a vector column: the data tells
    label_col: str
    label_is_numeric: bool
    element: str  # "float" or "double": the features' type in the chunks

    def spread_plan(self, keys: tuple[int, ...] = ()) -> SpreadPlan:
        """What the tasks that read the rows need of this plan to cut them into chunks;
        `keys` reach the training partitions of a shuffle (none without one)."""
        return SpreadPlan(
            keys=keys,
            n_models=self.settings.n_estimators,
            seed=self.settings.random_state,
            n_features=self.features.n_features,
            element=self.element,
            is_classifier=self.settings.is_classifier,
            label_is_numeric=self.label_is_numeric,
        )


def train_partition(plan: TrainingPlan, batches: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow function: fit the models of this partition, one after another.

    The partition arrives sorted: every source task's report first, then each model's
    chunks in turn. The totals are checked once the reports are in, before any fit; a
    model is fitted as soon as the next model's rows begin, so the task holds one model's
    rows at a time. Yields a row with model index -1 and the totals instead when the data
    fails a check (every task sees the same totals, so none trains) or the partition
    holds no rows.
    """
    task_started = time.time()
    dtype = np.float32 if plan.element == "float" else np.float64
    reports: dict[int, str] = {}
    checked: tuple[DataReport, DataSummary | None] | None = None
    loading: _Loading | None = None
    pool = pa.default_memory_pool()
    for batch in batches:
        chunks, batch_reports = read_chunks(batch)
        reports.update(batch_reports)  # one per source task, even if it arrived twice
        for model_index, data, labels in chunks:
            if checked is None:
                checked = _check(plan, reports)
            if checked[1] is None:
                break  # bad data: drain the input, train nothing
            if loading is not None and loading.model_index != model_index:
                yield _result_batch(*_fitted(plan, checked[1], loading, task_started), checked[0])
                loading = None
            if loading is None:
                rows = _Rows(dtype, plan.features.n_features)
                loading = _Loading(model_index, rows, _reset_peak_rss(), time.perf_counter())
            loading.rows.add(data, labels)
        del batch, chunks
        # Arrow's allocator keeps freed batches for reuse; without this the task holds
        # its partition about 1.5 times while loading (measured: 1.46x, then 1.0x).
        pool.release_unused()
    if checked is None:
        if not reports:
            return
        checked = _check(plan, reports)
    if loading is not None and checked[1] is not None:
        yield _result_batch(*_fitted(plan, checked[1], loading, task_started), checked[0])
    else:  # bad data, or a partition that received no rows
        yield _result_batch(-1, None, None, checked[0])


def train_in_place(
    plan: TrainingPlan, spread_plan: SpreadPlan, files: ParquetSource, batches: Iterator[Any]
) -> Iterator[Any]:
    """mapInArrow function of a shuffle read in place, one task per model: task j reads
    every row of `files` (one split, in file order), draws every row's model from the
    seed as every task does, keeps model j's rows and fits it.

    Every task reads the same rows in the same order, so the draws agree: each row goes
    to exactly one model, at random, whatever the number of task slots. Each task counts
    and checks every row, so each yields the whole data's totals, and none trains when
    they fail a check. It holds one model's rows, as a shuffled task does.
    """
    task_started = time.time()
    for _ in batches:
        pass  # the task's one row: its number is the model's
    model_index = max(0, partition_id())  # model 0 outside a task (called directly)
    report = DataReport()
    # Every row's model drawn up front: the draw depends on the rows' order alone, and the
    # model's matrix is allocated once at its size. A byte a row: a mask of its rows.
    rng = np.random.default_rng([plan.settings.random_state, 4])
    n_models = spread_plan.n_models
    mask = rng.integers(0, n_models, files.rows(0), dtype=np.min_scalar_type(n_models))
    mask = mask == model_index
    dtype = np.float32 if plan.element == "float" else np.float64
    rows = _Rows(dtype, plan.features.n_features, int(np.count_nonzero(mask)))
    loading = _Loading(model_index, rows, _reset_peak_rss(), time.perf_counter())
    pool = pa.default_memory_pool()
    done = 0
    for X, labels in split_pieces(spread_plan, files, 0, report, mask):
        pool.release_unused()  # the row groups read so far (see train_partition)
        mine = np.flatnonzero(mask[done : done + len(labels)])
        done += len(labels)
        if X is None or not report.clean or not len(mine):
            continue  # bad data: read on to count it all, keep nothing
        if len(X) != len(mine):  # a list column's piece holds every row
            X = X[mine]
        rows.add(X.reshape(-1), labels.take(pa.array(mine)))
    del mask
    pool.release_unused()  # the last row group's
    summary = _summary(plan, report)
    if summary is not None and rows.n_rows:
        yield _result_batch(*_fitted(plan, summary, loading, task_started), report)
    else:  # bad data, or a model drawn for no row
        yield _result_batch(-1, None, None, report)


def train_own_rows(
    plan: TrainingPlan,
    spread_plan: SpreadPlan,
    n_parts: int,
    files: ParquetSource | None,
    batches: Iterator[Any],
) -> Iterator[Any]:
    """mapInArrow function without a shuffle (shuffle=False): task p reads its part of
    the data and spreads the rows at random over its own models, p, p + P, p + 2P, ...
    (P = n_parts), then fits them one after another.

    The task checks its own part before any fit and finds its own classes; the driver
    checks the totals of every part's report (its last row, model index -1) and maps each
    model's classes onto the whole data's. A task holds all of its part's rows at once.
    """
    task_started = time.time()
    rss_before, started = _reset_peak_rss(), time.perf_counter()
    part = max(0, partition_id())  # part 0 outside a task (called directly)
    models = list(range(part, plan.settings.n_estimators, n_parts))
    report = DataReport()
    rows = _read_own_rows(plan, spread_plan, files, part, len(models), report, batches)
    summary = _summary(plan, report, whole=False) if report.rows and models else None
    read_seconds = time.perf_counter() - started
    if summary is not None:
        for model_index, model_rows in zip(models, rows, strict=True):
            if model_rows.n_rows:
                # Every model's load time is the reading of the whole part, done once.
                loaded = time.perf_counter() - read_seconds
                loading = _Loading(model_index, model_rows, rss_before, loaded)
                yield _result_batch(*_fitted(plan, summary, loading, task_started))
    yield _result_batch(-1, None, None, report)


def _read_own_rows(
    plan: TrainingPlan,
    spread_plan: SpreadPlan,
    files: ParquetSource | None,
    part: int,
    n_models: int,
    report: DataReport,
    batches: Iterator[Any],
) -> list[_Rows]:
    """This task's rows, read and spread at random over its `n_models` models; what was
    read is counted and checked into `report`, and nothing is kept once a check fails."""
    dtype = np.float32 if plan.element == "float" else np.float64
    rng = np.random.default_rng([plan.settings.random_state, 3, part])
    if files is None:
        pieces, drawn = spark_pieces(spread_plan, report, batches), None
        counts = np.zeros(n_models, dtype=np.int64)
    else:
        # A Parquet part's row count is known: every row's model is drawn up front, and
        # each model's matrix allocated once at its size. Grown a chunk at a time, several
        # matrices at once fragment the heap (K=8: 2.0-2.1x the part's bytes at peak).
        pieces = file_pieces(spread_plan, files, report, batches)
        drawn = rng.integers(0, max(1, n_models), files.rows(part), dtype=np.int32)
        counts = np.bincount(drawn, minlength=n_models)
    rows = [_Rows(dtype, plan.features.n_features, count) for count in counts]
    pool = pa.default_memory_pool()
    done = 0
    for X, labels in pieces:
        pool.release_unused()  # the row groups read so far (see train_partition)
        if X is None or not report.clean or not n_models:
            continue  # bad data: read on to count it all, keep nothing
        if drawn is None:
            index = rng.integers(0, n_models, len(X))
        else:
            index, done = drawn[done : done + len(X)], done + len(X)
        order = np.argsort(index, kind="stable")
        X, labels = X[order], labels.take(pa.array(order))
        start = 0
        for model_rows, count in zip(rows, np.bincount(index, minlength=n_models), strict=True):
            if count:
                model_rows.add(X[start : start + count].reshape(-1), labels.slice(start, count))
                start += count
    return rows


def _check(plan: TrainingPlan, reports: dict[int, str]) -> tuple[DataReport, Any]:
    """(the whole data's totals, its summary or None when it fails a check)."""
    report = DataReport.combined(DataReport.from_dict(json.loads(r)) for r in reports.values())
    return report, _summary(plan, report)


def _summary(plan: TrainingPlan, report: DataReport, whole: bool = True) -> DataSummary | None:
    """`summarize` of the report, or None (the reason logged) when the data fails a check."""
    try:
        return summarize(
            report, plan.features, plan.label_col, plan.settings, plan.label_is_numeric, whole
        )
    except ValueError as error:
        logger.warning("not training: %s", error)
        return None


@dataclass
class _Loading:
    """One model's rows, with the moment and the worker's memory their loading started
    from."""

    model_index: int
    rows: _Rows | None
    rss_before: int
    started: float


def _fitted(
    plan: TrainingPlan, summary: DataSummary, loading: _Loading, task_started: float
) -> tuple[int, tuple[str, str, bytes], EstimatorStats]:
    """Fit the model whose rows `loading` holds: (model index, model, stats)."""
    load_seconds = time.perf_counter() - loading.started
    peak_loaded = _peak_rss_bytes()
    features_per_model = choose_features(summary.features.n_features, plan.settings)
    X, y = loading.rows.arrays(summary.classes)
    loading.rows = None
    estimator, stats = fit_one(
        plan, summary, features_per_model[loading.model_index], loading.model_index, X, y
    )
    stats.task_started = task_started
    stats.partition_bytes = int(X.nbytes + y.nbytes)
    stats.load_seconds = load_seconds
    stats.worker_rss_before_bytes = loading.rss_before
    stats.worker_peak_rss_loaded_bytes = peak_loaded
    stats.worker_peak_rss_bytes = _peak_rss_bytes()
    del X, y
    dump_started = time.perf_counter()
    model = dump_estimator(estimator)
    stats.dump_seconds = time.perf_counter() - dump_started
    return loading.model_index, model, stats


def _result_batch(
    model_index: int,
    model: tuple[str, str, bytes] | None,
    stats: Any,
    report: DataReport | None = None,
) -> pa.RecordBatch:
    model_format, model_class, data = model if model is not None else (None, None, None)
    return pa.RecordBatch.from_pydict(
        {
            "model_index": [int(model_index)],
            "model_format": [model_format],
            "model_class": [model_class],
            "model_bytes": [data],
            "stats": [None if stats is None else json.dumps(stats.to_dict())],
            "report": [None if report is None else report.to_json()],
        },
        schema=_RESULT_ARROW_SCHEMA,
    )


class _Rows:
    """One model's rows, its feature matrix grown in place chunk by chunk.

    `ndarray.resize` reallocates, and a large allocation is a mapping of its own that
    grows with mremap, without copying: the matrix is built with one copy of each chunk
    and never held twice (collecting the chunks and concatenating them at the end would
    hold both, twice the partition's bytes).
    """

    def __init__(self, dtype: Any, n_features: int, capacity: int = 0) -> None:
        self.dtype = np.dtype(dtype)
        self.n_features = n_features  # 0 until the first chunk says, for a vector column
        self.capacity = capacity  # rows, where known ahead: the matrix is allocated once
        self.X = np.empty(0, dtype=self.dtype)
        self.n_rows = 0
        self.labels: list[np.ndarray] = []

    def add(self, data: np.ndarray, labels: pa.Array) -> None:
        """Append a chunk: its features as bytes (rows x n_features values) and labels.

        A chunk of another width is dropped: the source tasks' reports show the vectors'
        sizes differ, so the task trains nothing anyway.
        """
        n_rows = len(labels)
        if not self.n_features:
            self.n_features = data.nbytes // (n_rows * self.dtype.itemsize)
        if data.nbytes != n_rows * self.n_features * self.dtype.itemsize:
            return
        size = self.n_rows * self.n_features
        end = size + n_rows * self.n_features
        if not self.X.size:
            self.X = np.empty(max(end, self.capacity * self.n_features), dtype=self.dtype)
        elif self.X.size < end:
            self.X.resize(end, refcheck=False)
        self.X[size:end] = data.view(self.dtype)
        self.n_rows += n_rows
        # A copy: a slice of the batch's labels would keep the whole Arrow message (the
        # features too, one buffer) alive, and the task would hold its partition twice.
        self.labels.append(np.array(labels.to_numpy(zero_copy_only=False), copy=True))

    def arrays(self, classes: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """(X, y): a classifier's labels as indexes into the global `classes` (int32)."""
        X = self.X[: self.n_rows * self.n_features].reshape(self.n_rows, self.n_features)
        self.X = np.empty(0, dtype=self.dtype)
        y = np.concatenate(self.labels) if self.labels else np.empty(0)
        self.labels = []
        if classes is not None:
            y = np.searchsorted(classes, y).astype(np.int32)
        return X, y


def choose_features(n_features: int, settings: Settings) -> list[np.ndarray]:
    """Each model's feature indexes (sorted): all of them, or a random subspace.

    Drawn from the fit's seed alone, so the training tasks and the driver get the same
    subspaces.
    """
    if isinstance(settings.max_features, int):
        n_chosen = settings.max_features
    else:
        n_chosen = max(1, int(settings.max_features * n_features))
    if n_chosen == n_features:
        return [np.arange(n_features) for _ in range(settings.n_estimators)]
    rng = np.random.default_rng([settings.random_state, 1])
    return [
        np.sort(rng.choice(n_features, size=n_chosen, replace=False))
        for _ in range(settings.n_estimators)
    ]


def fit_one(
    plan: TrainingPlan,
    summary: DataSummary,
    columns: np.ndarray,
    model_index: int,
    X: np.ndarray,
    y: np.ndarray,
) -> tuple[Any, EstimatorStats]:
    """Fit model `model_index` on its partition's rows; returns (model, stats).

    Classifier labels arrive as indexes into the global classes. A model is fitted on the
    classes its rows contain, renumbered 0..k-1 (XGBoost requires contiguous labels), and
    `stats.class_indices` maps its outputs back to the global classes. A partition with a
    single class gets a constant model instead, since many estimators refuse one class.
    """
    from sklearn.base import clone
    from sklearn.dummy import DummyClassifier

    settings = plan.settings
    rng = np.random.default_rng([settings.random_state, model_index])
    n_rows = len(y)
    validation_rows, train_rows = _split(rng, n_rows, settings.validation_fraction)
    fit_rows = _sample(rng, train_rows, n_rows, settings.max_samples, settings.bootstrap)
    all_columns = len(columns) == X.shape[1]
    X_fit = _take(X, fit_rows, None if all_columns else columns)
    y_fit = y if fit_rows is None else y[fit_rows]
    stats = EstimatorStats(
        model_index=model_index,
        partition_id=partition_id(),
        rows=n_rows,
        rows_fit=len(y_fit),
        rows_validation=0 if validation_rows is None else len(validation_rows),
        versions=library_versions(),
    )
    if settings.is_classifier:
        seen = np.unique(y_fit).astype(np.int64)
        stats.class_indices = seen.tolist()
        stats.classes_seen = summary.classes[seen].tolist()
        y_fit = np.searchsorted(seen, y_fit)
        if len(seen) == 1:
            stats.single_class = True
            estimator = DummyClassifier(strategy="most_frequent")
            logger.warning("model %d saw a single class; it predicts a constant", model_index)
        else:
            estimator = _configured_clone(clone(settings.estimator), rng)
    else:
        estimator = _configured_clone(clone(settings.estimator), rng)

    stats.fit_started = time.time()
    started, started_cpu = time.perf_counter(), time.process_time()
    estimator.fit(X_fit, y_fit)
    stats.fit_seconds = time.perf_counter() - started
    # CPU below wall time means the task waited for a core (a busy or oversubscribed host).
    stats.fit_cpu_seconds = time.process_time() - started_cpu
    del X_fit
    if validation_rows is not None:
        X_val = _take(X, validation_rows, None if all_columns else columns)
        classes = stats.class_indices if settings.is_classifier else None
        stats.validation_score = _score(estimator, classes, X_val, y[validation_rows])
    return estimator, stats


def _score(estimator: Any, classes: list[int] | None, X: np.ndarray, y: np.ndarray) -> float:
    """A fitted model's accuracy (classifier: its outputs mapped onto the global class
    indexes) or R² on held-out rows."""
    from sklearn.metrics import accuracy_score, r2_score

    predicted = estimator.predict(X)
    if classes is not None:
        predicted = np.asarray(classes)[np.asarray(predicted, dtype=np.int64)]
        return float(accuracy_score(y, predicted))
    return float(r2_score(y, predicted))


def _split(rng: np.random.Generator, n_rows: int, fraction: float) -> tuple:
    """(validation rows, training rows); (None, None) means no hold-out, train on all."""
    if fraction <= 0.0 or n_rows < 4:
        return None, None
    n_validation = min(max(int(round(fraction * n_rows)), 2), n_rows - 2)
    order = rng.permutation(n_rows)
    return np.sort(order[:n_validation]), np.sort(order[n_validation:])


def _sample(
    rng: np.random.Generator,
    train_rows: np.ndarray | None,
    n_rows: int,
    max_samples: float,
    bootstrap: bool,
) -> np.ndarray | None:
    """Rows one model fits on; None means all of `train_rows` (or all rows), uncopied."""
    pool = n_rows if train_rows is None else len(train_rows)
    n_fit = max(1, int(round(max_samples * pool)))
    if bootstrap:
        picked = rng.integers(0, pool, size=n_fit)
    elif n_fit < pool:
        picked = np.sort(rng.choice(pool, size=n_fit, replace=False))
    else:
        return train_rows
    return picked if train_rows is None else train_rows[picked]


def _take(X: np.ndarray, rows: np.ndarray | None, columns: np.ndarray | None) -> np.ndarray:
    if rows is None:
        return X if columns is None else X[:, columns]
    return X[rows] if columns is None else X[np.ix_(rows, columns)]


def _configured_clone(estimator: Any, rng: np.random.Generator) -> Any:
    """Give each model its own seed (as bagging does) and the task's cores, not the host's."""
    params = estimator.get_params()
    updates: dict[str, Any] = {}
    if "random_state" in params:
        updates["random_state"] = int(rng.integers(np.iinfo(np.int32).max))
    if "n_jobs" in params and params["n_jobs"] is None:
        updates["n_jobs"] = task_cpus()
    return estimator.set_params(**updates) if updates else estimator


def _reset_peak_rss() -> int:
    """This worker's resident bytes now, after resetting its peak so `_peak_rss_bytes` is
    this task's peak even in a reused worker (Linux: /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * resource.getpagesize()
    except OSError:
        return 0


def _peak_rss_bytes() -> int:
    """Peak resident bytes of this worker since `_reset_peak_rss` (since its start where the
    peak cannot be reset)."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
