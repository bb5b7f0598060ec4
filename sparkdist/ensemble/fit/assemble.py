"""A fit's last step, on the driver: the data's totals checked (the ValueError of the
first that fails), and the fitted ensemble built from the training job's rows."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from sparkdist.ensemble.fit.job import OwnRows, Shuffled
from sparkdist.ensemble.fit.training import TrainingPlan, choose_features
from sparkdist.ensemble.fit.validation import DataReport, DataSummary, Settings, summarize
from sparkdist.ensemble.model.ensemble_model import PartitionEnsembleModel
from sparkdist.ensemble.model.serialization import check_sklearn_version, load_estimator
from sparkdist.ensemble.model.stats import EstimatorStats

logger = logging.getLogger(__name__)


def assemble(
    rows: Sequence[Any], plan: TrainingPlan, route: Shuffled | OwnRows, params: dict[str, Any]
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
    recorded["random_state"] = plan.random_state
    return assemble_model(
        [row for row in rows if row["model_index"] >= 0],
        summary,
        settings,
        choose_features(summary.features.n_features, settings, plan.random_state),
        recorded,
    )


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
