"""A fit's first step, on the driver: the parameters and the schema checked, and the
training job planned: what its tasks need (`TrainingPlan`) and the route of the rows to
them (`job.Shuffled` or `job.OwnRows`), chosen once by `shuffle`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sparkdist.ensemble.fit.job import OwnRows, Shuffled
from sparkdist.ensemble.fit.training import TrainingPlan
from sparkdist.ensemble.fit.validation import (
    check_label_type,
    check_max_features,
    check_random_state,
    check_settings,
)
from sparkdist.ensemble.model.features import resolve_features
from sparkdist.spark import arrow_jobs, session_slots


def plan_fit(
    params: dict[str, Any], df: Any, features_col: str | Sequence[str], label_col: str
) -> tuple[TrainingPlan, Shuffled | OwnRows]:
    """(what the training tasks need, the route of the rows to them) for fitting the
    estimator's `params` (`get_params()`) on `df`; a ValueError names a bad parameter or
    column before any Spark job."""
    if not hasattr(df, "sparkSession") or not hasattr(df, "mapInArrow"):
        raise TypeError(
            f"fit takes a Spark DataFrame, got {type(df).__name__}; for data in memory "
            "train the estimator itself"
        )
    estimator = params["estimator"]
    settings = check_settings(
        estimator,
        params["n_estimators"],
        params["max_samples"],
        params["bootstrap"],
        params["max_features"],
        params["voting"],
        params["weights"],
        params["validation_fraction"],
        params["shuffle"],
    )
    seed = check_random_state(params["random_state"])
    spec = resolve_features(df.schema, features_col)
    label_is_numeric = check_label_type(df.schema, label_col, settings.is_classifier)
    check_max_features(settings, spec.n_features)
    plan = TrainingPlan(
        estimator=estimator,
        settings=settings,
        features=spec,
        label_col=label_col,
        label_is_numeric=label_is_numeric,
        element=spec.training_element(df.schema, estimator),
        random_state=seed,
    )
    slots = session_slots(df.sparkSession)
    n_tasks = min(settings.n_estimators, slots or settings.n_estimators)
    if settings.shuffle:
        return plan, Shuffled(tuple(arrow_jobs.partition_keys(df.sparkSession, n_tasks)), slots)
    return plan, OwnRows(n_tasks)
