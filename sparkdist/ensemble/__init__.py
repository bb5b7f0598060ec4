"""Partition ensembles: one scikit-learn or XGBoost model per Spark partition."""

from sparkdist.ensemble.model import PartitionEnsembleModel, load_model
from sparkdist.ensemble.partition_ensemble import PartitionEnsemble
from sparkdist.ensemble.serialization import VersionMismatchError
from sparkdist.ensemble.spark_ml import SparkPartitionEnsemble, SparkPartitionEnsembleModel
from sparkdist.ensemble.training import EstimatorStats

__all__ = [
    "EstimatorStats",
    "PartitionEnsemble",
    "PartitionEnsembleModel",
    "SparkPartitionEnsemble",
    "SparkPartitionEnsembleModel",
    "VersionMismatchError",
    "load_model",
]
