"""A fit on the driver, in the order it runs: the plan, the training job, the fitted model.

1. `plan_fit`: the parameters checked by their table (`ensemble.params`) and the columns
   by `model.features`, before any Spark job; the route of the rows to the training
   tasks chosen once by `shuffle`: `Shuffled` (a spread stage sends every row at random
   to its model's training task), `ReadInPlace` (the same random spread of a plain
   Parquet scan with few models, each model's task reading every row and keeping its
   own) or `OwnRows` (each task reads its own part).
2. `run_training`: one Spark job on that route, run by the tasks' side (`partitioning`
   reads and spreads the rows, `training` fits the models), under a description in the
   Spark UI and with a progress display in models; its rows, one per model trained plus
   the tasks' data reports, come back here.
3. `assemble`: the data's totals checked (`validation`, the ValueError of the first check
   that fails), the fitted ensemble built.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from sparkdist.ensemble.fit.parquet_source import ParquetSource, parse_bytes
from sparkdist.ensemble.fit.partitioning import (
    in_place,
    indexes,
    own_parts,
    partition_keys,
    spread,
)
from sparkdist.ensemble.fit.training import (
    RESULT_SCHEMA,
    TrainingPlan,
    choose_features,
    train_in_place,
    train_own_rows,
    train_partition,
)
from sparkdist.ensemble.fit.validation import DataReport, DataSummary, check_max_features, summarize
from sparkdist.ensemble.model.ensemble_model import PartitionEnsembleModel
from sparkdist.ensemble.model.features import check_label_type, resolve_features
from sparkdist.ensemble.model.serialization import check_sklearn_version, load_estimator
from sparkdist.ensemble.model.stats import EstimatorStats
from sparkdist.ensemble.params import Settings, check_params
from sparkdist.spark import jobs, session_slots

logger = logging.getLogger(__name__)

# Arrow batches of the spread's chunks, as they reach a training task: each row of the
# spread is a chunk of many rows, and a batch is cut at 10,000 rows by default, so
# uncapped a task could receive its whole partition as one batch and hold it twice.
_TRAINING_BATCH_BYTES = 4 * 2**20
_MAX_BATCH_BYTES = "spark.sql.execution.arrow.maxBytesPerBatch"


# --- 1. the plan ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Shuffled:
    """shuffle=True: a spread stage sends every row at random to its model's training
    task, and every training task receives every source task's report."""

    keys: tuple[int, ...]  # keys[p] is hashed to training partition p
    slots: int | None  # the cluster's task slots, for cutting Parquet files into splits

    n_stages = 2  # the spread, then the training

    @property
    def n_tasks(self) -> int:
        return len(self.keys)

    def training_job(self, df: Any, plan: TrainingPlan) -> Any:
        chunks = spread(df, plan.features, plan.label_col, plan.spread_plan(self.keys), self.slots)
        return chunks.mapInArrow(partial(train_partition, plan), RESULT_SCHEMA)

    def totals(self, reports: Sequence[DataReport]) -> DataReport:
        """Every task saw the same totals: any one report holds them."""
        return reports[0] if reports else DataReport()


@dataclass(frozen=True)
class ReadInPlace:
    """shuffle=True on a plain Parquet scan with at most `MAX_READERS_IN_PLACE` models, one
    task each: every task reads every row, draws each row's model as the others do and
    keeps its own; no spread stage, and every task's report holds the totals."""

    files: ParquetSource  # one split of every row, in file order
    n_tasks: int  # = n_estimators
    n_stages = 1

    def training_job(self, df: Any, plan: TrainingPlan) -> Any:
        train = partial(train_in_place, plan, plan.spread_plan(), self.files)
        return indexes(df.sparkSession, self.n_tasks).mapInArrow(train, RESULT_SCHEMA)

    def totals(self, reports: Sequence[DataReport]) -> DataReport:
        return reports[0] if reports else DataReport()


@dataclass(frozen=True)
class OwnRows:
    """shuffle=False: each of `n_tasks` training tasks reads its own part of the data and
    spreads it over its own models; its report counts that part only."""

    n_tasks: int
    n_stages = 1

    def training_job(self, df: Any, plan: TrainingPlan) -> Any:
        spread_plan = plan.spread_plan()
        parts, files = own_parts(df, plan.features, plan.label_col, spread_plan, self.n_tasks)
        train = partial(train_own_rows, plan, spread_plan, self.n_tasks, files)
        return parts.mapInArrow(train, RESULT_SCHEMA)

    def totals(self, reports: Sequence[DataReport]) -> DataReport:
        """The parts' reports (each task's last row) add up to the whole data's."""
        return DataReport.combined(reports)


def plan_fit(
    params: dict[str, Any], df: Any, features_col: str | Sequence[str], label_col: str
) -> tuple[TrainingPlan, Shuffled | ReadInPlace | OwnRows]:
    """(what the training tasks need, the route of the rows to them) for fitting the
    estimator's `params` (`get_params()`) on `df`; a ValueError names a bad parameter or
    column before any Spark job."""
    if not hasattr(df, "sparkSession") or not hasattr(df, "mapInArrow"):
        raise TypeError(
            f"fit takes a Spark DataFrame, got {type(df).__name__}; for data in memory "
            "train the estimator itself"
        )
    settings = check_params(params)
    spec = resolve_features(df.schema, features_col)
    label_is_numeric = check_label_type(df.schema, label_col, settings.is_classifier)
    element = spec.training_element(df.schema, settings.estimator)
    check_max_features(settings, spec.n_features)
    plan = TrainingPlan(
        settings=settings,
        features=spec,
        label_col=label_col,
        label_is_numeric=label_is_numeric,
        element=element,
    )
    slots = session_slots(df.sparkSession)
    n_tasks = min(settings.n_estimators, slots or settings.n_estimators)
    if not settings.shuffle:
        return plan, OwnRows(n_tasks)
    if n_tasks == settings.n_estimators:  # a task per model
        files = in_place(df, spec, label_col, label_is_numeric, n_tasks)
        if files is not None:
            return plan, ReadInPlace(files, n_tasks)
    return plan, Shuffled(tuple(partition_keys(df.sparkSession, n_tasks)), slots)


# --- 2. the training job -------------------------------------------------------------------


def run_training(df: Any, plan: TrainingPlan, route: Shuffled | ReadInPlace | OwnRows) -> list[Any]:
    """Run the training job: its rows, one per model trained and the tasks' reports,
    collected under a description in the Spark UI while a progress display counts the
    models."""
    started = time.perf_counter()
    n_models = plan.settings.n_estimators
    description = f"sparkdist ensemble: {n_models} x {type(plan.settings.estimator).__name__}"
    job = route.training_job(df, plan)
    count = models_done(
        partial(_models_in_tasks, n_models, route.n_tasks), n_models, route.n_stages
    )
    session = df.sparkSession
    with (
        _arrow_batches_of_at_most(session, _TRAINING_BATCH_BYTES),
        jobs.described(session, description) as group,
        jobs.watched(session, group, description, unit="models", count=count),
    ):
        rows = job.collect()
    logger.info(
        "trained %d models in %.1fs",
        sum(row["model_index"] >= 0 for row in rows),
        time.perf_counter() - started,
    )
    return rows


def _models_in_tasks(n_models: int, n_tasks: int, k: int) -> int:
    """The models the first k training tasks to finish trained at least: task p trains
    models p, p + P, ... (P = n_tasks), so every task trains n_models // P of them and
    the first n_models % P tasks one more."""
    if k >= n_tasks:
        return n_models
    return k * (n_models // n_tasks) + max(0, k - (n_tasks - n_models % n_tasks))


def models_done(models_per_task: Callable[[int], int], n_models: int, n_stages: int) -> Callable:
    """A `jobs.watched` count of `n_models` models, not tasks, for a job whose last stage
    trains them: `models_per_task(k)` once k of its tasks finished, all once it finished.
    Nothing counts before `n_stages` stages were seen (the training stage is the last of
    them, the one with the highest id, also when adaptive execution runs a shuffle's map
    stage as a job of its own first)."""

    def count(stages: list[jobs.StageCount]) -> tuple[int, int]:
        if len(stages) < n_stages:
            return 0, n_models
        last = max(stages, key=lambda stage: stage.stage_id)
        done = n_models if last.done >= last.total else models_per_task(last.done)
        return done, n_models

    return count


@contextlib.contextmanager
def _arrow_batches_of_at_most(spark: Any, n_bytes: int) -> Iterator[None]:
    """Cap the Arrow batches Spark sends Python at `n_bytes` while inside. A batch is cut
    at 10,000 rows by default; the setting is read when the job is planned, so it is
    restored as soon as the job has run."""
    previous = spark.conf.get(_MAX_BATCH_BYTES, None)
    if previous is not None and 0 < parse_bytes(previous) <= n_bytes:
        yield
        return
    spark.conf.set(_MAX_BATCH_BYTES, str(n_bytes))
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(_MAX_BATCH_BYTES)
        else:
            spark.conf.set(_MAX_BATCH_BYTES, previous)


# --- 3. the fitted model -------------------------------------------------------------------


def assemble(
    rows: Sequence[Any],
    plan: TrainingPlan,
    route: Shuffled | ReadInPlace | OwnRows,
    params: dict[str, Any],
) -> PartitionEnsembleModel:
    """The fitted model from the training job's `rows`, recording the estimator's
    `params` (`get_params()`) with the seed the fit used."""
    reports = [DataReport.from_dict(json.loads(r["report"])) for r in rows if r["report"]]
    settings = plan.settings
    summary = summarize(
        route.totals(reports), plan.features, plan.label_col, settings, plan.label_is_numeric
    )
    logger.info(
        "trained %d models on %d rows x %d features%s",
        settings.n_estimators,
        summary.n_rows,
        summary.features.n_features,
        "" if summary.classes is None else f", {len(summary.classes)} classes",
    )
    recorded = _json_params(params)
    recorded["random_state"] = settings.random_state
    return assemble_model(
        [row for row in rows if row["model_index"] >= 0],
        summary,
        settings,
        choose_features(summary.features.n_features, settings),
        recorded,
    )


def assemble_model(
    rows: Sequence[Any],
    summary: DataSummary,
    settings: Settings,
    features_per_model: Sequence[np.ndarray],
    params: dict[str, Any],
) -> PartitionEnsembleModel:
    """The fitted ensemble from the training tasks' result rows.

    Warns about models that got no rows (too few rows for their number) and about models that
    saw a single class, and refuses pickles made by another scikit-learn version than the
    driver's before opening them.
    """
    rows = sorted(rows, key=lambda row: row["model_index"])
    stats = [EstimatorStats.from_dict(json.loads(row["stats"])) for row in rows]
    if summary.classes is not None:
        # A model's outputs are the classes it saw, found in the whole data's classes (a
        # model trained without a shuffle knew only its own part's classes).
        for model_stats in stats:
            seen = np.asarray(model_stats.classes_seen, dtype=summary.classes.dtype)
            model_stats.class_indices = np.searchsorted(summary.classes, seen).tolist()
    _warn_about_missing_models(rows, settings, summary.n_rows)
    if not rows:
        raise ValueError("every partition was empty; no model was trained")
    single = [s.model_index for s in stats if s.single_class]
    if single:
        logger.warning(
            "models %s saw a single class in their partition and predict it as a constant",
            single,
        )
    for model_stats in stats:
        check_sklearn_version(
            model_stats.versions.get("scikit-learn"),
            f"model {model_stats.model_index} (trained on an executor)",
        )
    estimators = [
        load_estimator(row["model_format"], row["model_class"], row["model_bytes"]) for row in rows
    ]
    return PartitionEnsembleModel(
        estimators=estimators,
        estimators_features=[features_per_model[s.model_index] for s in stats],
        estimators_stats=stats,
        features=summary.features,
        label_col=summary.label_col,
        label_is_numeric=summary.label_is_numeric,
        classes=summary.classes,
        voting=settings.voting,
        weighting=settings.weights,
        params=params,
    )


def _warn_about_missing_models(rows: Sequence[Any], settings: Settings, n_rows: int) -> None:
    """Models that got no rows (too few rows for their number) are skipped, with a warning."""
    missing = sorted(set(range(settings.n_estimators)) - {row["model_index"] for row in rows})
    if missing:
        logger.warning(
            "models %s got no rows and were skipped: the ensemble has %d of the %d "
            "models asked for (%d rows over %d models%s)",
            missing,
            len(rows),
            settings.n_estimators,
            n_rows,
            settings.n_estimators,
            ""
            if settings.shuffle
            else "; with shuffle=False a model gets rows only from its task's part: "
            "the DataFrame has fewer partitions than tasks, repartition it or shuffle",
        )


def _json_params(params: dict[str, Any]) -> dict[str, Any]:
    """The ensemble's parameters as JSON values; the estimator is recorded by class."""
    out: dict[str, Any] = {}
    for name, value in params.items():
        if name == "estimator":
            cls = type(value)
            out["estimator"] = f"{cls.__module__}.{cls.__qualname__}"
            out["estimator_repr"] = repr(value)
        elif isinstance(value, np.generic):
            out[name] = value.item()
        else:
            out[name] = value
    return out
