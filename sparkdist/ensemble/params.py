"""The ensemble's parameters, declared once: one row each in `ENSEMBLE_PARAMS`.

A row gives a parameter's scikit-learn name (PartitionEnsemble's constructor), its Spark
ML name (SparkPartitionEnsemble's Param), its default, its doc and its check, as
scikit-learn's `_parameter_constraints` does. Everything else reads the table:
PartitionEnsemble's explicit signature (scikit-learn's get_params reads it) takes its
defaults from `DEFAULT`; the Spark ML stage declares its Params, getters and keyword
signature from the rows; a fit checks `get_params()` with `check_params`, which gives the
`Settings` the training tasks read, one field per row.

No pyspark or scikit-learn import here at import time: importing pyspark.ml costs half a
second that scikit-learn users of PartitionEnsemble need not pay, and the training tasks
import this module.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, make_dataclass
from typing import Any

import numpy as np

VOTING = ("soft", "hard")
WEIGHTS = ("uniform", "validation")

# A check takes a parameter's value and the parameters checked before it (in the table's
# order), and gives the value to train with, or raises a ValueError that names the
# parameter and says how to fix it.
Check = Callable[[Any, Mapping[str, Any]], Any]


@dataclass(frozen=True)
class EnsembleParam:
    """One parameter under both of its names; a default of None means unset (the check
    resolves it: validation_fraction from weights, random_state drawn)."""

    name: str  # PartitionEnsemble's (scikit-learn's) name
    spark_name: str  # SparkPartitionEnsemble's Param (Spark ML's camelCase)
    default: Any
    value_type: type | None  # the Spark ML Param's type (its TypeConverter); None: any object
    doc: str  # the Spark ML Param's doc
    check: Check


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)


def _is_classifier(estimator: Any) -> bool:
    """scikit-learn's is_classifier, imported on first use."""
    from sklearn.base import is_classifier

    return bool(is_classifier(estimator))


def _estimator(estimator: Any, _: Mapping[str, Any]) -> Any:
    """A scikit-learn classifier or regressor."""
    from sklearn.base import is_regressor

    if estimator is None or not hasattr(estimator, "fit") or not hasattr(estimator, "predict"):
        raise ValueError(
            f"estimator must be a scikit-learn-compatible model with fit and predict, "
            f"got {estimator!r}"
        )
    if not _is_classifier(estimator) and not is_regressor(estimator):
        raise ValueError(
            f"estimator {type(estimator).__name__} is neither a classifier nor a regressor "
            "(scikit-learn's is_classifier/is_regressor); pass a classifier or a regressor"
        )
    return estimator


def _n_estimators(value: Any, _: Mapping[str, Any]) -> int:
    if not _is_int(value) or value < 1:
        raise ValueError(f"n_estimators must be an integer >= 1, got {value!r}")
    return int(value)


def _max_samples(value: Any, _: Mapping[str, Any]) -> float:
    if not _is_number(value) or not 0.0 < value <= 1.0:
        raise ValueError(
            f"max_samples is the fraction of a partition's rows each model fits on, in (0, 1]; "
            f"got {value!r}"
        )
    return float(value)


def _flag(name: str) -> Check:
    """The check of a True/False parameter."""

    def check(value: Any, _: Mapping[str, Any]) -> bool:
        if not isinstance(value, bool | np.bool_):
            raise ValueError(f"{name} must be True or False, got {value!r}")
        return bool(value)

    return check


def _max_features(value: Any, _: Mapping[str, Any]) -> float | int:
    if _is_int(value):
        if value < 1:
            raise ValueError(f"max_features as a count must be >= 1, got {value!r}")
        return int(value)
    if not _is_number(value) or not 0.0 < value <= 1.0:
        raise ValueError(
            f"max_features must be a fraction in (0, 1] or a count of features >= 1, got {value!r}"
        )
    return float(value)


def _voting(value: Any, checked: Mapping[str, Any]) -> str:
    if value not in VOTING:
        raise ValueError(f"voting must be one of {VOTING}, got {value!r}")
    estimator = checked["estimator"]
    if value == "soft" and _is_classifier(estimator) and not hasattr(estimator, "predict_proba"):
        raise ValueError(
            f"voting='soft' averages predict_proba, which {type(estimator).__name__} does not "
            "have; use voting='hard', or an estimator with predict_proba"
        )
    return value


def _weights(value: Any, _: Mapping[str, Any]) -> str:
    if value not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, got {value!r}")
    return value


def _validation_fraction(value: Any, checked: Mapping[str, Any]) -> float:
    """None: 0.1 with weights="validation", else 0 (no hold-out)."""
    if value is None:
        value = 0.1 if checked["weights"] == "validation" else 0.0
    if not _is_number(value) or not 0.0 <= value < 1.0:
        raise ValueError(f"validation_fraction must be in [0, 1), got {value!r}")
    if checked["weights"] == "validation" and value == 0.0:
        raise ValueError(
            "weights='validation' scores each model on a held-out slice of its partition; "
            "set validation_fraction > 0 (for example 0.1)"
        )
    return float(value)


def _random_state(value: Any, _: Mapping[str, Any]) -> int:
    """The seed of a fit: `value`, or one drawn when it is None."""
    if value is None:
        return int(np.random.SeedSequence().generate_state(1)[0] & 0x7FFFFFFF)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(
            f"random_state must be an int or None (it seeds Spark's rand), got {value!r}"
        )
    if not 0 <= value < 2**63:
        raise ValueError(f"random_state must be >= 0, got {value}")
    return int(value)


ENSEMBLE_PARAMS: tuple[EnsembleParam, ...] = (
    EnsembleParam(
        "estimator",
        "estimator",
        None,
        None,
        "scikit-learn-compatible classifier or regressor, trained once per partition",
        _estimator,
    ),
    EnsembleParam(
        "n_estimators",
        "nEstimators",
        8,
        int,
        "number of partitions, one model each",
        _n_estimators,
    ),
    EnsembleParam(
        "max_samples",
        "maxSamples",
        1.0,
        float,
        "fraction of its partition's rows each model fits on, in (0, 1]",
        _max_samples,
    ),
    EnsembleParam(
        "bootstrap",
        "bootstrap",
        False,
        bool,
        "draw each model's rows with replacement",
        _flag("bootstrap"),
    ),
    EnsembleParam(
        "max_features",
        "maxFeatures",
        1.0,
        float,
        "fraction of the features in each model's random subspace, in (0, 1]",
        _max_features,
    ),
    EnsembleParam(
        "voting",
        "voting",
        "soft",
        str,
        "'soft' (average probabilities) or 'hard' (count votes) for classifiers",
        _voting,
    ),
    EnsembleParam(
        "weights",
        "weights",
        "uniform",
        str,
        "'uniform', or 'validation' to weight models by their held-out score",
        _weights,
    ),
    EnsembleParam(
        "validation_fraction",
        "validationFraction",
        None,
        float,
        "share of each partition held out to score its model",
        _validation_fraction,
    ),
    EnsembleParam(
        "random_state",
        "seed",
        None,
        int,
        "random seed for the row spread and sampling; unset draws one",
        _random_state,
    ),
    EnsembleParam(
        "shuffle",
        "shuffle",
        True,
        bool,
        "spread all rows over all models with a shuffle (True), or keep rows in the task "
        "that reads them (False: faster, biased if the data is sorted)",
        _flag("shuffle"),
    ),
)

# Defaults by scikit-learn name, for PartitionEnsemble's signature.
DEFAULT: dict[str, Any] = {param.name: param.default for param in ENSEMBLE_PARAMS}

# The parameters after checking (`check_params`), one field per row of the table, with
# the defaults resolved (validation_fraction a float, random_state the seed drawn), and
# whether the estimator is a classifier. What the training tasks read; frozen, and
# shipped to them in the task closure.
Settings = make_dataclass(
    "Settings",
    [(param.name, Any) for param in ENSEMBLE_PARAMS] + [("is_classifier", bool)],
    frozen=True,
    namespace={"__module__": __name__},
)


def check_params(params: Mapping[str, Any]) -> Settings:
    """The `Settings` of an ensemble's `params` (`get_params()`), checked in the table's
    order; a ValueError names the first bad one, before any Spark job."""
    checked: dict[str, Any] = {}
    for param in ENSEMBLE_PARAMS:
        checked[param.name] = param.check(params[param.name], checked)
    return Settings(**checked, is_classifier=_is_classifier(checked["estimator"]))
