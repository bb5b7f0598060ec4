"""Spark ML Estimator/Model pair around PartitionEnsemble, for `pyspark.ml.Pipeline`.

Parameters are Spark ML Params (camelCase, as in Spark ML); fitting delegates to
PartitionEnsemble and prediction to PartitionEnsembleModel.transform. Persistence follows
xgboost.spark: Spark ML's metadata for the Params, plus the ensemble's own directory
(manifest and one file per model) written through Spark, so `Pipeline.save`,
`PipelineModel.save` and their loads work on any filesystem Spark can write.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import cloudpickle
from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (
    HasFeaturesCol,
    HasLabelCol,
    HasPredictionCol,
    HasProbabilityCol,
)
from pyspark.ml.util import (
    DefaultParamsReader,
    DefaultParamsWriter,
    MLReadable,
    MLReader,
    MLWritable,
    MLWriter,
)

from sparkdist.ensemble.model import PartitionEnsembleModel, load_model
from sparkdist.ensemble.partition_ensemble import PartitionEnsemble
from sparkdist.ensemble.serialization import check_sklearn_version, library_versions
from sparkdist.ensemble.storage import open_storage
from sparkdist.ensemble.validation import DEFAULTS

logger = logging.getLogger(__name__)

_ENSEMBLE_DIR = "ensemble"
_ESTIMATOR_DIR = "estimator"


class _PartitionEnsembleParams(HasFeaturesCol, HasLabelCol, HasPredictionCol, HasProbabilityCol):
    """Params shared by the estimator and the model."""

    estimator: Param[Any] = Param(
        Params._dummy(),
        "estimator",
        "scikit-learn-compatible classifier or regressor, trained once per partition",
    )
    featuresCols: Param[list[str]] = Param(
        Params._dummy(),
        "featuresCols",
        "numeric feature columns, used instead of featuresCol when set",
        typeConverter=TypeConverters.toListString,
    )
    nEstimators: Param[int] = Param(
        Params._dummy(),
        "nEstimators",
        "number of partitions, one model each",
        typeConverter=TypeConverters.toInt,
    )
    maxSamples: Param[float] = Param(
        Params._dummy(),
        "maxSamples",
        "fraction of its partition's rows each model fits on, in (0, 1]",
        typeConverter=TypeConverters.toFloat,
    )
    bootstrap: Param[bool] = Param(
        Params._dummy(),
        "bootstrap",
        "draw each model's rows with replacement",
        typeConverter=TypeConverters.toBoolean,
    )
    maxFeatures: Param[float] = Param(
        Params._dummy(),
        "maxFeatures",
        "fraction of the features in each model's random subspace, in (0, 1]",
        typeConverter=TypeConverters.toFloat,
    )
    voting: Param[str] = Param(
        Params._dummy(),
        "voting",
        "'soft' (average probabilities) or 'hard' (count votes) for classifiers",
        typeConverter=TypeConverters.toString,
    )
    weights: Param[str] = Param(
        Params._dummy(),
        "weights",
        "'uniform', or 'validation' to weight models by their held-out score",
        typeConverter=TypeConverters.toString,
    )
    shuffle: Param[bool] = Param(
        Params._dummy(),
        "shuffle",
        "spread all rows over all models with a shuffle (True), or keep rows in the task "
        "that reads them (False: faster, biased if the data is sorted)",
        typeConverter=TypeConverters.toBoolean,
    )
    validationFraction: Param[float] = Param(
        Params._dummy(),
        "validationFraction",
        "share of each partition held out to score its model",
        typeConverter=TypeConverters.toFloat,
    )
    seed: Param[int] = Param(
        Params._dummy(),
        "seed",
        "random seed for the row spread and sampling; unset draws one",
        typeConverter=TypeConverters.toInt,
    )

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(
            nEstimators=DEFAULTS.n_estimators,
            maxSamples=DEFAULTS.max_samples,
            bootstrap=DEFAULTS.bootstrap,
            maxFeatures=DEFAULTS.max_features,
            voting=DEFAULTS.voting,
            weights=DEFAULTS.weights,
            shuffle=DEFAULTS.shuffle,
        )

    def getEstimator(self) -> Any:
        return self.getOrDefault(self.estimator)

    def getFeaturesCols(self) -> list[str] | None:
        return self.getOrDefault(self.featuresCols) if self.isDefined(self.featuresCols) else None

    def getNEstimators(self) -> int:
        return self.getOrDefault(self.nEstimators)

    def getMaxSamples(self) -> float:
        return self.getOrDefault(self.maxSamples)

    def getBootstrap(self) -> bool:
        return self.getOrDefault(self.bootstrap)

    def getMaxFeatures(self) -> float:
        return self.getOrDefault(self.maxFeatures)

    def getVoting(self) -> str:
        return self.getOrDefault(self.voting)

    def getShuffle(self) -> bool:
        return self.getOrDefault(self.shuffle)

    def getWeights(self) -> str:
        return self.getOrDefault(self.weights)

    def getValidationFraction(self) -> float | None:
        if not self.isDefined(self.validationFraction):
            return None
        return self.getOrDefault(self.validationFraction)

    def getSeed(self) -> int | None:
        return self.getOrDefault(self.seed) if self.isDefined(self.seed) else None

    def _json_param_map(self) -> dict[str, Any]:
        """User-set Params as JSON; the estimator object is stored separately."""
        return {p.name: v for p, v in self._paramMap.items() if p.name != "estimator"}


class SparkPartitionEnsemble(Estimator, _PartitionEnsembleParams, MLReadable, MLWritable):
    """Spark ML Estimator: one scikit-learn/XGBoost model per partition.

    >>> ensemble = SparkPartitionEnsemble(estimator=XGBClassifier(), nEstimators=8)
    >>> model = Pipeline(stages=[VectorAssembler(...), ensemble]).fit(df)
    """

    @keyword_only
    def __init__(
        self,
        *,
        estimator: Any = None,
        featuresCol: str = "features",
        featuresCols: list[str] | None = None,
        labelCol: str = "label",
        predictionCol: str = "prediction",
        probabilityCol: str = "probability",
        nEstimators: int = DEFAULTS.n_estimators,
        maxSamples: float = DEFAULTS.max_samples,
        bootstrap: bool = DEFAULTS.bootstrap,
        maxFeatures: float = DEFAULTS.max_features,
        voting: str = DEFAULTS.voting,
        weights: str = DEFAULTS.weights,
        validationFraction: float | None = None,
        seed: int | None = None,
        shuffle: bool = DEFAULTS.shuffle,
    ) -> None:
        super().__init__()
        self._set(**self._input_kwargs)

    @keyword_only
    def setParams(
        self,
        *,
        estimator: Any = None,
        featuresCol: str = "features",
        featuresCols: list[str] | None = None,
        labelCol: str = "label",
        predictionCol: str = "prediction",
        probabilityCol: str = "probability",
        nEstimators: int = DEFAULTS.n_estimators,
        maxSamples: float = DEFAULTS.max_samples,
        bootstrap: bool = DEFAULTS.bootstrap,
        maxFeatures: float = DEFAULTS.max_features,
        voting: str = DEFAULTS.voting,
        weights: str = DEFAULTS.weights,
        validationFraction: float | None = None,
        seed: int | None = None,
        shuffle: bool = DEFAULTS.shuffle,
    ) -> SparkPartitionEnsemble:
        """Set any of the Params by keyword."""
        return self._set(**self._input_kwargs)

    def setEstimator(self, value: Any) -> SparkPartitionEnsemble:
        return self._set(estimator=value)

    def setNEstimators(self, value: int) -> SparkPartitionEnsemble:
        return self._set(nEstimators=value)

    def _fit(self, dataset: Any) -> SparkPartitionEnsembleModel:
        if not self.isDefined(self.estimator) or self.getEstimator() is None:
            raise ValueError(
                "SparkPartitionEnsemble needs estimator=... (a scikit-learn or XGBoost model)"
            )
        seed = self.getSeed()
        ensemble = PartitionEnsemble(
            self.getEstimator(),
            n_estimators=self.getNEstimators(),
            max_samples=self.getMaxSamples(),
            bootstrap=self.getBootstrap(),
            max_features=self.getMaxFeatures(),
            voting=self.getVoting(),
            weights=self.getWeights(),
            validation_fraction=self.getValidationFraction(),
            random_state=None if seed is None else seed % (2**31),
            shuffle=self.getShuffle(),
        )
        fitted = ensemble.fit(
            dataset,
            features_col=self.getFeaturesCols() or self.getFeaturesCol(),
            label_col=self.getLabelCol(),
        )
        model = SparkPartitionEnsembleModel(fitted)
        self._copyValues(model)
        return model

    def write(self) -> MLWriter:
        _require_classic_persistence(self)
        return _EstimatorWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        _require_classic_persistence(cls)
        return _EstimatorReader(cls)


class SparkPartitionEnsembleModel(Model, _PartitionEnsembleParams, MLReadable, MLWritable):
    """Spark ML Model: the fitted PartitionEnsembleModel, predicting with a pandas UDF."""

    def __init__(self, ensemble: PartitionEnsembleModel | None = None) -> None:
        super().__init__()
        self.ensemble = ensemble

    def _transform(self, dataset: Any) -> Any:
        if self.ensemble is None:
            raise ValueError("this SparkPartitionEnsembleModel holds no fitted ensemble")
        return self.ensemble.transform(
            dataset,
            prediction_col=self.getPredictionCol(),
            probability_col=self.getProbabilityCol() or None,
        )

    def write(self) -> MLWriter:
        _require_classic_persistence(self)
        return _ModelWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        _require_classic_persistence(cls)
        return _ModelReader(cls)


def _require_classic_persistence(stage: Any) -> None:
    """Spark ML persistence writes metadata on the cluster and the models beside it
    through the Hadoop filesystem: both sides need a classic session."""
    from pyspark.sql import SparkSession

    from sparkdist.spark import require_classic

    require_classic(
        SparkSession.getActiveSession(),
        f"Spark ML persistence of {getattr(stage, '__name__', type(stage).__name__)} "
        "(write/save/load, Pipeline save)",
        "On Spark Connect, fit and transform work; save the fitted ensemble with "
        "model.ensemble.save(path) and load it with sparkdist.ensemble.load_model(path), or "
        "log it with MLflow.",
    )


class _EstimatorWriter(MLWriter):
    """Params as Spark ML metadata; the unfitted estimator pickled with library versions."""

    def __init__(self, instance: SparkPartitionEnsemble) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        DefaultParamsWriter.saveMetadata(
            self.instance, path, self.sparkSession, paramMap=self.instance._json_param_map()
        )
        if self.instance.isDefined(self.instance.estimator):
            storage = open_storage(os.path.join(path, _ESTIMATOR_DIR), self.sparkSession)
            storage.write("versions.json", json.dumps(library_versions()).encode("utf-8"))
            storage.write("estimator.pkl", cloudpickle.dumps(self.instance.getEstimator()))


class _EstimatorReader(MLReader):
    def __init__(self, cls: type) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> SparkPartitionEnsemble:
        import pickle

        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        instance = self.cls()
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        storage = open_storage(os.path.join(path, _ESTIMATOR_DIR), self.sparkSession)
        if storage.exists():
            versions = json.loads(storage.read("versions.json"))
            check_sklearn_version(versions.get("scikit-learn"), path)
            instance._set(estimator=pickle.loads(storage.read("estimator.pkl")))
        return instance


class _ModelWriter(MLWriter):
    """Params as Spark ML metadata; the ensemble in its own directory beside them."""

    def __init__(self, instance: SparkPartitionEnsembleModel) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        if self.instance.ensemble is None:
            raise ValueError("cannot save a SparkPartitionEnsembleModel without an ensemble")
        DefaultParamsWriter.saveMetadata(
            self.instance, path, self.sparkSession, paramMap=self.instance._json_param_map()
        )
        self.instance.ensemble.save(os.path.join(path, _ENSEMBLE_DIR), spark=self.sparkSession)


class _ModelReader(MLReader):
    def __init__(self, cls: type) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> SparkPartitionEnsembleModel:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        ensemble = load_model(os.path.join(path, _ENSEMBLE_DIR), spark=self.sparkSession)
        instance = self.cls(ensemble)
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        return instance
