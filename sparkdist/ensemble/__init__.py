"""Partition ensembles: one scikit-learn or XGBoost model per Spark partition.

Names are imported on first use: the tasks that read and spread the rows import only
`sparkdist.ensemble.fit.partitioning` and what it needs, not scikit-learn (1.6 s of imports
that a Python worker Spark started afresh would pay before reading a row).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "EstimatorStats": "sparkdist.ensemble.model.stats",
    "PartitionEnsemble": "sparkdist.ensemble.partition_ensemble",
    "PartitionEnsembleModel": "sparkdist.ensemble.model.ensemble_model",
    "SparkPartitionEnsemble": "sparkdist.ensemble.spark_ml",
    "SparkPartitionEnsembleModel": "sparkdist.ensemble.spark_ml",
    "VersionMismatchError": "sparkdist.ensemble.model.serialization",
    "load_model": "sparkdist.ensemble.model.ensemble_model",
    "log_ensemble": "sparkdist.ensemble.mlflow_flavor",
}

__all__ = [
    "EstimatorStats",
    "PartitionEnsemble",
    "PartitionEnsembleModel",
    "SparkPartitionEnsemble",
    "SparkPartitionEnsembleModel",
    "VersionMismatchError",
    "load_model",
    "log_ensemble",
]

if TYPE_CHECKING:
    from sparkdist.ensemble.mlflow_flavor import log_ensemble
    from sparkdist.ensemble.model.ensemble_model import PartitionEnsembleModel, load_model
    from sparkdist.ensemble.model.serialization import VersionMismatchError
    from sparkdist.ensemble.model.stats import EstimatorStats
    from sparkdist.ensemble.partition_ensemble import PartitionEnsemble
    from sparkdist.ensemble.spark_ml import SparkPartitionEnsemble, SparkPartitionEnsembleModel


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'sparkdist.ensemble' has no attribute {name!r}")
