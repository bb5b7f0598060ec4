"""PartitionEnsemble: train one scikit-learn or XGBoost model per Spark partition.

Big data, small models: rows are spread at random over `n_estimators` partitions, each
partition trains one independent model on its executor, and only the fitted models come
back to the driver, where they predict together. No training data passes through the
driver. The parameter names are those of scikit-learn's BaggingClassifier where they fit.
"""

from __future__ import annotations

import json
import logging
import numbers
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator

from sparkdist.ensemble.features import resolve_features
from sparkdist.ensemble.fit.partitioning import own_parts, spread
from sparkdist.ensemble.fit.training import (
    RESULT_SCHEMA,
    TrainingPlan,
    choose_features,
    train_own_rows,
    train_partition,
)
from sparkdist.ensemble.fit.validation import (
    DataReport,
    DataSummary,
    Settings,
    check_label_type,
    check_max_features,
    check_settings,
    summarize,
)
from sparkdist.ensemble.model.ensemble_model import PartitionEnsembleModel
from sparkdist.ensemble.model.serialization import check_sklearn_version, load_estimator
from sparkdist.ensemble.model.stats import EstimatorStats
from sparkdist.ensemble.params import DEFAULT
from sparkdist.spark import arrow_jobs, session_slots

logger = logging.getLogger(__name__)

# Arrow batches of the spread's chunks, as they reach a training task: each row of the
# spread is a chunk of many rows, and a batch is cut at 10,000 rows by default, so
# uncapped a task could receive its whole partition as one batch and hold it twice.
_TRAINING_BATCH_BYTES = 4 * 2**20


class PartitionEnsemble(BaseEstimator):
    """An ensemble of `n_estimators` models, each trained on one random partition of a
    Spark DataFrame.

    Parameters
    ----------
    estimator : a scikit-learn-compatible classifier or regressor (scikit-learn models and
        pipelines, `xgboost.XGBClassifier` / `XGBRegressor`), cloned once per model.
    n_estimators : number of models; the rows are spread at random into as many shares.
    max_samples : fraction of its share's rows each model fits on.
    bootstrap : draw those rows with replacement.
    max_features : features per model, a fraction in (0, 1] or a count; each model gets
        its own random subset (`estimators_features_`).
    voting : "soft" (average probabilities) or "hard" (count votes); classifiers only,
        regressors average their predictions.
    weights : "uniform", or "validation" to weight each model by its score (accuracy or
        R²) on a held-out slice of its own share.
    validation_fraction : fraction of each model's rows held out for that score; defaults to
        0.1 with weights="validation" and to 0 (no hold-out, no score) otherwise.
    random_state : seeds the row spread, the row and feature sampling and each model's
        own seed. None draws one (recorded on the fitted model as params["random_state"]).
    shuffle : True (the default) spreads every row at random over all models through a
        Spark shuffle. False keeps rows in the task that reads them: P = min(n_estimators,
        task slots) tasks each read 1/P of the data (equal row ranges of a Parquet scan, or
        Spark's partitions coalesced into P) and spread it over their own models. Faster
        (no shuffle), and as accurate when the rows' order is random (for example data
        written after a `repartition`); biased when the data is sorted (by time, by label),
        since each model sees one slice of it. Its data checks run per task, so bad rows
        fail the fit after the other tasks' models have trained.
    """

    def __init__(
        self,
        estimator: Any = DEFAULT["estimator"],
        *,
        n_estimators: int = DEFAULT["n_estimators"],
        max_samples: float = DEFAULT["max_samples"],
        bootstrap: bool = DEFAULT["bootstrap"],
        max_features: float | int = DEFAULT["max_features"],
        voting: str = DEFAULT["voting"],
        weights: str = DEFAULT["weights"],
        validation_fraction: float | None = DEFAULT["validation_fraction"],
        random_state: int | None = DEFAULT["random_state"],
        shuffle: bool = DEFAULT["shuffle"],
    ) -> None:
        # Written out, not derived: scikit-learn's get_params reads this signature.
        self.estimator = estimator
        self.n_estimators = n_estimators
        self.max_samples = max_samples
        self.bootstrap = bootstrap
        self.max_features = max_features
        self.voting = voting
        self.weights = weights
        self.validation_fraction = validation_fraction
        self.random_state = random_state
        self.shuffle = shuffle

    def fit(
        self,
        df: Any,
        features_col: str | Sequence[str] = "features",
        label_col: str = "label",
    ) -> PartitionEnsembleModel:
        """Train one model per partition of the Spark DataFrame `df`; returns the fitted model.

        `features_col` is a Spark ML vector column (VectorAssembler output), an array
        column, or a list of numeric columns. The data is read once: the tasks that read
        it spread its rows at random over the partitions in chunks and count what they
        read, and each training task checks those totals (and finds a classifier's
        classes) before it fits; a ValueError says what is wrong with the data.
        """
        fit_started = time.perf_counter()
        plan, route = self._plan(df, features_col, label_col)
        started, training_started = time.perf_counter(), time.time()
        rows = _run(df, plan, route)
        trained = time.perf_counter()
        model = self._assemble(rows, plan, route)
        model.fit_timings_ = {
            "checks_seconds": started - fit_started,
            "training_job_seconds": trained - started,
            "training_job_started": training_started,
            "assemble_seconds": time.perf_counter() - trained,
        }
        return model

    def _plan(
        self, df: Any, features_col: str | Sequence[str], label_col: str
    ) -> tuple[TrainingPlan, _Shuffled | _OwnRows]:
        """Check the parameters and the schema, and plan the training job: what its tasks
        need, and the route of the rows to them (chosen here, once, by `shuffle`)."""
        if not hasattr(df, "sparkSession") or not hasattr(df, "mapInArrow"):
            raise TypeError(
                f"fit takes a Spark DataFrame, got {type(df).__name__}; for data in memory "
                "train the estimator itself"
            )
        settings = check_settings(
            self.estimator,
            self.n_estimators,
            self.max_samples,
            self.bootstrap,
            self.max_features,
            self.voting,
            self.weights,
            self.validation_fraction,
            self.shuffle,
        )
        seed = self._seed()
        spec = resolve_features(df.schema, features_col)
        label_is_numeric = check_label_type(df.schema, label_col, settings.is_classifier)
        check_max_features(settings, spec.n_features)
        plan = TrainingPlan(
            estimator=self.estimator,
            settings=settings,
            features=spec,
            label_col=label_col,
            label_is_numeric=label_is_numeric,
            element=spec.training_element(df.schema, self.estimator),
            random_state=seed,
        )
        slots = session_slots(df.sparkSession)
        n_tasks = min(settings.n_estimators, slots or settings.n_estimators)
        if settings.shuffle:
            return plan, _Shuffled(
                tuple(arrow_jobs.partition_keys(df.sparkSession, n_tasks)), slots
            )
        return plan, _OwnRows(n_tasks)

    def _assemble(
        self, rows: Sequence[Any], plan: TrainingPlan, route: _Shuffled | _OwnRows
    ) -> PartitionEnsembleModel:
        """The fitted model from the training job's rows, once the data's totals pass the
        checks (the ValueError of the first that fails)."""
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
        params = _json_params(self.get_params(deep=False))
        params["random_state"] = plan.random_state
        return assemble_model(
            [row for row in rows if row["model_index"] >= 0],
            summary,
            settings,
            choose_features(summary.features.n_features, settings, plan.random_state),
            params,
        )

    def _seed(self) -> int:
        if self.random_state is None:
            return int(np.random.SeedSequence().generate_state(1)[0] & 0x7FFFFFFF)
        if isinstance(self.random_state, bool) or not isinstance(
            self.random_state, numbers.Integral
        ):
            raise ValueError(
                f"random_state must be an int or None (it seeds Spark's rand), "
                f"got {self.random_state!r}"
            )
        if not 0 <= self.random_state < 2**63:
            raise ValueError(f"random_state must be >= 0, got {self.random_state}")
        return int(self.random_state)


@dataclass(frozen=True)
class _Shuffled:
    """shuffle=True: a spread stage sends every row at random to its model's training
    task, and every training task receives every source task's report."""

    keys: tuple[int, ...]  # keys[p] is hashed to training partition p
    slots: int | None  # the cluster's task slots, for cutting Parquet files into splits

    n_stages = 2  # the spread, then the training

    @property
    def n_tasks(self) -> int:
        return len(self.keys)

    def training_job(self, df: Any, plan: TrainingPlan) -> Any:
        spread_plan = plan.spread_plan(self.keys)
        chunks = spread(df, plan.features, plan.label_col, spread_plan, self.slots)
        return arrow_jobs.on_each_partition(chunks, partial(train_partition, plan), RESULT_SCHEMA)

    def totals(self, reports: Sequence[DataReport]) -> DataReport:
        """Every task saw the same totals: any one report holds them."""
        return reports[0] if reports else DataReport()


@dataclass(frozen=True)
class _OwnRows:
    """shuffle=False: each of `n_tasks` training tasks reads its own part of the data and
    spreads it over its own models; its report counts that part only."""

    n_tasks: int
    n_stages = 1

    def training_job(self, df: Any, plan: TrainingPlan) -> Any:
        spread_plan = plan.spread_plan()
        parts, files = own_parts(df, plan.features, plan.label_col, spread_plan, self.n_tasks)
        train = partial(train_own_rows, plan, spread_plan, self.n_tasks, files)
        return arrow_jobs.on_each_partition(parts, train, RESULT_SCHEMA)

    def totals(self, reports: Sequence[DataReport]) -> DataReport:
        """The parts' reports (each task's last row) add up to the whole data's."""
        return DataReport.combined(reports)


def _run(df: Any, plan: TrainingPlan, route: _Shuffled | _OwnRows) -> list[Any]:
    """Run the training job: its rows, one per model trained and the tasks' reports."""
    started = time.perf_counter()
    n_models = plan.settings.n_estimators
    rows = arrow_jobs.collect(
        route.training_job(df, plan),
        f"sparkdist ensemble: {n_models} x {type(plan.estimator).__name__}",
        _TRAINING_BATCH_BYTES,
        unit="models",
        count=arrow_jobs.models_done(
            partial(_models_in_tasks, n_models, route.n_tasks), n_models, route.n_stages
        ),
    )
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


def assemble_model(
    rows: Sequence[Any],
    summary: DataSummary,
    settings: Settings,
    features_per_model: Sequence[np.ndarray],
    params: dict[str, Any],
) -> PartitionEnsembleModel:
    """The fitted ensemble from the training tasks' result rows, on the driver.

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
    missing = sorted(set(range(settings.n_estimators)) - {row["model_index"] for row in rows})
    if missing:
        logger.warning(
            "models %s got no rows and were skipped: the ensemble has %d of the %d "
            "models asked for (%d rows over %d models%s)",
            missing,
            len(rows),
            settings.n_estimators,
            summary.n_rows,
            settings.n_estimators,
            ""
            if settings.shuffle
            else "; with shuffle=False a model gets rows only from its task's part: "
            "the DataFrame has fewer partitions than tasks, repartition it or shuffle",
        )
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
