"""The partition-wise training function: one partition's rows in, one fitted model out.

It runs on the executors inside `mapInArrow`: the partition's Arrow batches are copied
once into one feature matrix, each batch released as soon as it is copied (a task's memory
grows with its partition, never with the data set), one model is fitted per model index
found (normally exactly one), and each yields a single row: the model as bytes plus its
statistics. Only those rows reach the driver.
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from sparkdist.ensemble.serialization import dump_estimator, library_versions

logger = logging.getLogger(__name__)

FEATURES_COL = "__sparkdist_features"
LABEL_COL = "__sparkdist_label"
# One training task's result rows: (name, Spark SQL type, Arrow type) of each column.
_RESULT_COLUMNS = (
    ("model_index", "int", pa.int32()),
    ("model_format", "string", pa.string()),
    ("model_class", "string", pa.string()),
    ("model_bytes", "binary", pa.binary()),
    ("stats", "string", pa.string()),
)
RESULT_SCHEMA = ", ".join(f"{name} {sql_type}" for name, sql_type, _ in _RESULT_COLUMNS)
_RESULT_ARROW_SCHEMA = pa.schema([(name, arrow_type) for name, _, arrow_type in _RESULT_COLUMNS])


@dataclass(frozen=True)
class TrainingPlan:
    """Everything a training task needs; shipped to the executors in the task closure."""

    estimator: Any
    is_classifier: bool
    classes: np.ndarray | None
    n_features: int
    estimators_features: tuple[np.ndarray, ...]
    max_samples: float
    bootstrap: bool
    validation_fraction: float
    random_state: int


@dataclass
class EstimatorStats:
    """What one model saw and how it did, recorded by the task that trained it."""

    model_index: int
    partition_id: int
    rows: int
    rows_fit: int
    rows_validation: int
    classes_seen: list[Any] = field(default_factory=list)
    class_indices: list[int] = field(default_factory=list)
    single_class: bool = False
    validation_score: float | None = None
    fit_seconds: float = 0.0
    fit_cpu_seconds: float = 0.0
    fit_started: float = 0.0  # Unix time, to line the models' fits up on one timeline
    task_started: float = 0.0  # Unix time the task's Python function started
    load_seconds: float = 0.0  # receiving the partition's rows and building its matrix
    dump_seconds: float = 0.0  # serializing the fitted model for the driver
    partition_bytes: int = 0
    worker_peak_rss_bytes: int = 0  # peak while this task ran (the worker's, if not resettable)
    worker_rss_before_bytes: int = 0  # the worker's resident memory before it received rows
    versions: dict[str, str | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EstimatorStats:
        return cls(**data)


def train_partition(plan: TrainingPlan, batches: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow function: fit one model per model index in this partition.

    An empty partition yields nothing; the driver notices the missing model and warns.
    """
    task_started = time.time()
    rss_before = _reset_peak_rss()
    started = time.perf_counter()
    indexes, features, labels = [], [], []
    for batch in batches:
        if batch.num_rows == 0:
            continue
        indexes.append(batch.column(0).to_numpy(zero_copy_only=False))
        features.append(_feature_matrix(batch.column(1), plan.n_features))
        labels.append(batch.column(2).to_numpy(zero_copy_only=False))
    if not indexes:
        return
    index = np.concatenate(indexes)
    y = np.concatenate(labels)
    del indexes, labels
    X = _stack(features)
    load_seconds = time.perf_counter() - started
    partition_bytes = int(X.nbytes + y.nbytes)
    model_indexes = np.unique(index)
    for model_index in model_indexes:
        if len(model_indexes) == 1:
            X_model, y_model = X, y
        else:
            rows = index == model_index
            X_model, y_model = X[rows], y[rows]
        estimator, stats = fit_one(plan, int(model_index), X_model, y_model)
        stats.task_started = task_started
        stats.partition_bytes = partition_bytes
        stats.load_seconds = load_seconds
        stats.worker_rss_before_bytes = rss_before
        stats.worker_peak_rss_bytes = _peak_rss_bytes()
        dump_started = time.perf_counter()
        model_format, model_class, data = dump_estimator(estimator)
        stats.dump_seconds = time.perf_counter() - dump_started
        yield pa.RecordBatch.from_pydict(
            {
                "model_index": [int(model_index)],
                "model_format": [model_format],
                "model_class": [model_class],
                "model_bytes": [data],
                "stats": [_stats_json(stats)],
            },
            schema=_RESULT_ARROW_SCHEMA,
        )


def fit_one(
    plan: TrainingPlan, model_index: int, X: np.ndarray, y: np.ndarray
) -> tuple[Any, EstimatorStats]:
    """Fit model `model_index` on its partition's rows; returns (model, stats).

    Classifier labels arrive as indexes into the global classes. A model is fitted on the
    classes its rows contain, renumbered 0..k-1 (XGBoost requires contiguous labels), and
    `stats.class_indices` maps its outputs back to the global classes. A partition with a
    single class gets a constant model instead, since many estimators refuse one class.
    """
    from sklearn.base import clone
    from sklearn.dummy import DummyClassifier
    from sklearn.metrics import accuracy_score, r2_score

    rng = np.random.default_rng([plan.random_state, model_index])
    n_rows = len(y)
    validation_rows, train_rows = _split(rng, n_rows, plan.validation_fraction)
    fit_rows = _sample(rng, train_rows, n_rows, plan.max_samples, plan.bootstrap)
    columns = plan.estimators_features[model_index]
    all_columns = len(columns) == plan.n_features
    X_fit = _take(X, fit_rows, None if all_columns else columns)
    y_fit = y if fit_rows is None else y[fit_rows]

    stats = EstimatorStats(
        model_index=model_index,
        partition_id=_partition_id(),
        rows=n_rows,
        rows_fit=len(y_fit),
        rows_validation=0 if validation_rows is None else len(validation_rows),
        versions=library_versions(),
    )
    if plan.is_classifier:
        seen = np.unique(y_fit).astype(np.int64)
        stats.class_indices = seen.tolist()
        stats.classes_seen = plan.classes[seen].tolist()
        y_fit = np.searchsorted(seen, y_fit)
        if len(seen) == 1:
            stats.single_class = True
            estimator = DummyClassifier(strategy="most_frequent")
            logger.warning("model %d saw a single class; it predicts a constant", model_index)
        else:
            estimator = _configured_clone(clone(plan.estimator), rng)
    else:
        estimator = _configured_clone(clone(plan.estimator), rng)

    stats.fit_started = time.time()
    started, started_cpu = time.perf_counter(), time.process_time()
    estimator.fit(X_fit, y_fit)
    stats.fit_seconds = time.perf_counter() - started
    # CPU below wall time means the task waited for a core (a busy or oversubscribed host).
    stats.fit_cpu_seconds = time.process_time() - started_cpu
    del X_fit

    if validation_rows is not None:
        X_val = _take(X, validation_rows, None if all_columns else columns)
        predicted = estimator.predict(X_val)
        if plan.is_classifier:
            predicted = np.asarray(stats.class_indices)[np.asarray(predicted, dtype=np.int64)]
            stats.validation_score = float(accuracy_score(y[validation_rows], predicted))
        else:
            stats.validation_score = float(r2_score(y[validation_rows], predicted))
    return estimator, stats


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
        updates["n_jobs"] = _task_cpus()
    return estimator.set_params(**updates) if updates else estimator


def _feature_matrix(column: Any, n_features: int) -> np.ndarray:
    """An Arrow list<double> (or list<float>) column as an (rows, n_features) matrix: a view
    of the Arrow buffer, without row objects or a copy."""
    values = column.flatten().to_numpy(zero_copy_only=False)
    if len(values) != len(column) * n_features:
        raise ValueError(
            f"a feature vector does not have {n_features} values; every row needs the same "
            "number of features"
        )
    if values.dtype not in (np.float32, np.float64):
        values = values.astype(np.float64)
    return values.reshape(len(column), n_features)


def _stack(blocks: list[np.ndarray]) -> np.ndarray:
    """One matrix from the batches' matrices, emptying `blocks` as it goes.

    Each block is dropped right after its copy, so its Arrow batch can be freed while the
    matrix fills, rather than all batches and the whole matrix being held at once.
    """
    if len(blocks) == 1:
        return blocks.pop()
    n_rows = sum(len(block) for block in blocks)
    out = np.empty((n_rows, blocks[0].shape[1]), dtype=blocks[0].dtype)
    row = 0
    for i in range(len(blocks)):
        block, blocks[i] = blocks[i], None
        out[row : row + len(block)] = block
        row += len(block)
        del block
    blocks.clear()
    return out


def _stats_json(stats: EstimatorStats) -> str:
    import json

    return json.dumps(stats.to_dict())


def _partition_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return -1 if context is None else context.partitionId()


def _task_cpus() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return 1 if context is None else max(1, context.cpus())


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
