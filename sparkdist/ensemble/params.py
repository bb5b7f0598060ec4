"""The ensemble's parameters, defined once for PartitionEnsemble and its Spark ML stage.

Each parameter has a scikit-learn name (PartitionEnsemble's constructor) and a Spark ML
name (SparkPartitionEnsemble's Param): the Spark ML Params, their getters and the stage's
keyword signature are built from `ENSEMBLE_PARAMS`, and PartitionEnsemble's explicit
signature (scikit-learn's get_params reads it) takes its defaults from `DEFAULT`. No
pyspark import here: importing pyspark.ml costs half a second that scikit-learn users of
PartitionEnsemble need not pay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkdist.ensemble.fit.validation import DEFAULTS


@dataclass(frozen=True)
class EnsembleParam:
    """One parameter under both of its names; a default of None means unset (the fit
    resolves it: validation_fraction from weights, random_state drawn)."""

    name: str  # PartitionEnsemble's (scikit-learn's) name
    spark_name: str  # SparkPartitionEnsemble's Param (Spark ML's camelCase)
    default: Any
    value_type: type | None  # the Spark ML Param's type (its TypeConverter); None: any object
    doc: str  # the Spark ML Param's doc


ENSEMBLE_PARAMS: tuple[EnsembleParam, ...] = (
    EnsembleParam(
        "estimator",
        "estimator",
        None,
        None,
        "scikit-learn-compatible classifier or regressor, trained once per partition",
    ),
    EnsembleParam(
        "n_estimators",
        "nEstimators",
        DEFAULTS.n_estimators,
        int,
        "number of partitions, one model each",
    ),
    EnsembleParam(
        "max_samples",
        "maxSamples",
        DEFAULTS.max_samples,
        float,
        "fraction of its partition's rows each model fits on, in (0, 1]",
    ),
    EnsembleParam(
        "bootstrap",
        "bootstrap",
        DEFAULTS.bootstrap,
        bool,
        "draw each model's rows with replacement",
    ),
    EnsembleParam(
        "max_features",
        "maxFeatures",
        DEFAULTS.max_features,
        float,
        "fraction of the features in each model's random subspace, in (0, 1]",
    ),
    EnsembleParam(
        "voting",
        "voting",
        DEFAULTS.voting,
        str,
        "'soft' (average probabilities) or 'hard' (count votes) for classifiers",
    ),
    EnsembleParam(
        "weights",
        "weights",
        DEFAULTS.weights,
        str,
        "'uniform', or 'validation' to weight models by their held-out score",
    ),
    EnsembleParam(
        "validation_fraction",
        "validationFraction",
        None,
        float,
        "share of each partition held out to score its model",
    ),
    EnsembleParam(
        "random_state",
        "seed",
        None,
        int,
        "random seed for the row spread and sampling; unset draws one",
    ),
    EnsembleParam(
        "shuffle",
        "shuffle",
        DEFAULTS.shuffle,
        bool,
        "spread all rows over all models with a shuffle (True), or keep rows in the task "
        "that reads them (False: faster, biased if the data is sorted)",
    ),
)

# Defaults by scikit-learn name, for PartitionEnsemble's signature.
DEFAULT: dict[str, Any] = {param.name: param.default for param in ENSEMBLE_PARAMS}
