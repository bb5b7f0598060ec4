"""Spark ML Estimator/Model pair around PartitionEnsemble, for `pyspark.ml.Pipeline`.

Parameters are Spark ML Params (camelCase, as in Spark ML), declared from the ensemble's
one parameter table (params.ENSEMBLE_PARAMS) with their getters and the stage's keyword
signature; fitting delegates to PartitionEnsemble and prediction to
PartitionEnsembleModel.transform. Persistence follows xgboost.spark: Spark ML's metadata
for the Params, plus the ensemble's own directory (manifest and one file per model)
written through Spark, so `Pipeline.save`, `PipelineModel.save` and their loads work on
any filesystem Spark can write, with pyspark 3.5 and 4.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
from collections.abc import Callable
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

from sparkdist.ensemble.model.ensemble_model import PartitionEnsembleModel, load_model
from sparkdist.ensemble.model.serialization import check_sklearn_version, library_versions
from sparkdist.ensemble.params import ENSEMBLE_PARAMS
from sparkdist.ensemble.partition_ensemble import PartitionEnsemble
from sparkdist.spark.storage import open_storage

logger = logging.getLogger(__name__)

_ENSEMBLE_DIR = "ensemble"
_ESTIMATOR_DIR = "estimator"


_CONVERTERS = {
    int: TypeConverters.toInt,
    float: TypeConverters.toFloat,
    bool: TypeConverters.toBoolean,
    str: TypeConverters.toString,
}

# The stage's column Params beside the ensemble's own, with their defaults, for its keyword
# signature: featuresCols is declared below, the others by pyspark's shared mixins.
_COLUMN_PARAMS = (
    ("featuresCol", "features"),
    ("featuresCols", None),
    ("labelCol", "label"),
    ("predictionCol", "prediction"),
    ("probabilityCol", "probability"),
)


def _getter_name(spark_name: str) -> str:
    return "get" + spark_name[0].upper() + spark_name[1:]


def _declare_ensemble_params(cls: type) -> type:
    """A Param and its getter (getNEstimators, ...) for each of ENSEMBLE_PARAMS, as
    xgboost.spark declares its Params from the XGBoost estimator's."""
    for param in ENSEMBLE_PARAMS:
        converter = _CONVERTERS.get(param.value_type)  # None: any object (the estimator)
        spark_param: Param[Any] = Param(
            Params._dummy(), param.spark_name, param.doc, typeConverter=converter
        )
        setattr(cls, param.spark_name, spark_param)
        getter = _getter(param.spark_name)
        getter.__qualname__ = f"{cls.__qualname__}.{getter.__name__}"
        setattr(cls, getter.__name__, getter)
    return cls


def _getter(spark_name: str) -> Callable[[Any], Any]:
    def getter(self: Any) -> Any:
        return self._get_or_none(spark_name)

    getter.__name__ = _getter_name(spark_name)
    getter.__doc__ = f"The value of {spark_name}; None when it is unset and has no default."
    return getter


@_declare_ensemble_params
class _PartitionEnsembleParams(HasFeaturesCol, HasLabelCol, HasPredictionCol, HasProbabilityCol):
    """Params shared by the estimator and the model: the ensemble's own (declared from
    ENSEMBLE_PARAMS) and the columns."""

    featuresCols: Param[list[str]] = Param(
        Params._dummy(),
        "featuresCols",
        "numeric feature columns, used instead of featuresCol when set",
        typeConverter=TypeConverters.toListString,
    )

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(
            **{p.spark_name: p.default for p in ENSEMBLE_PARAMS if p.default is not None}
        )

    def getFeaturesCols(self) -> list[str] | None:
        return self._get_or_none("featuresCols")

    def _get_or_none(self, spark_name: str) -> Any:
        param = self.getParam(spark_name)
        return self.getOrDefault(param) if self.isDefined(param) else None

    def _ensemble_params(self) -> dict[str, Any]:
        """PartitionEnsemble's parameters from the Params; a Spark ML seed may be any long,
        random_state is cut to 31 bits."""
        params = {p.name: self._get_or_none(p.spark_name) for p in ENSEMBLE_PARAMS}
        if params["random_state"] is not None:
            params["random_state"] %= 2**31
        return params

    def _json_param_map(self) -> dict[str, Any]:
        """User-set Params as JSON; the estimator object is stored separately."""
        return {p.name: v for p, v in self._paramMap.items() if p.name != "estimator"}


# The keyword signature of SparkPartitionEnsemble's __init__ and setParams.
_STAGE_SIGNATURE = inspect.Signature(
    [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    + [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
        for name, default in [(p.spark_name, p.default) for p in ENSEMBLE_PARAMS]
        + list(_COLUMN_PARAMS)
    ]
)


def _stage_keywords(method: Callable[..., Any]) -> Callable[..., Any]:
    """pyspark's keyword_only (the keywords given land in `self._input_kwargs`) with
    `_STAGE_SIGNATURE` as the signature: help() lists the Params and their defaults, and
    any other name is a TypeError, as with a signature written out."""

    @functools.wraps(method)
    def checked(self: Any, **kwargs: Any) -> Any:
        try:
            _STAGE_SIGNATURE.bind(self, **kwargs)
        except TypeError as error:
            raise TypeError(f"{method.__qualname__}() {error}") from None
        return method(self, **kwargs)

    wrapper = keyword_only(checked)
    wrapper.__signature__ = _STAGE_SIGNATURE  # type: ignore[attr-defined]
    return wrapper


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


def _metadata_context(session: Any) -> Any:
    """What Spark ML's `DefaultParamsWriter.saveMetadata` and `DefaultParamsReader.loadMetadata`
    take: pyspark 4 a SparkSession (it writes and reads the metadata through a DataFrame,
    which a Spark Connect session has too), pyspark 3.5 a SparkContext (it calls
    `sc.parallelize(...).saveAsTextFile` and `sc.textFile`, which a SparkSession lacks)."""
    import pyspark

    if int(pyspark.__version__.split(".")[0]) >= 4:
        return session
    return session.sparkContext


class _StageWriter(MLWriter):
    """Writes a stage's Params as Spark ML metadata; a subclass adds what goes beside them."""

    def __init__(self, instance: Any) -> None:
        super().__init__()
        self.instance = instance

    def _save_params(self, path: str) -> None:
        DefaultParamsWriter.saveMetadata(
            self.instance,
            path,
            _metadata_context(self.sparkSession),
            paramMap=self.instance._json_param_map(),
        )


class _StageReader(MLReader):
    """Reads a stage's Params from Spark ML metadata; a subclass reads what is beside them."""

    def __init__(self, cls: type) -> None:
        super().__init__()
        self.cls = cls

    def _metadata(self, path: str) -> dict[str, Any]:
        return DefaultParamsReader.loadMetadata(path, _metadata_context(self.sparkSession))

    def _with_params(self, instance: Any, metadata: dict[str, Any]) -> Any:
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        return instance


class _EstimatorWriter(_StageWriter):
    """Params as Spark ML metadata; the unfitted estimator pickled with library versions."""

    def saveImpl(self, path: str) -> None:
        self._save_params(path)
        if self.instance.isDefined(self.instance.estimator):
            storage = open_storage(os.path.join(path, _ESTIMATOR_DIR), self.sparkSession)
            storage.write("versions.json", json.dumps(library_versions()).encode("utf-8"))
            storage.write("estimator.pkl", cloudpickle.dumps(self.instance.getEstimator()))


class _EstimatorReader(_StageReader):
    def load(self, path: str) -> SparkPartitionEnsemble:
        import pickle

        instance = self._with_params(self.cls(), self._metadata(path))
        storage = open_storage(os.path.join(path, _ESTIMATOR_DIR), self.sparkSession)
        if storage.exists():
            versions = json.loads(storage.read("versions.json"))
            check_sklearn_version(versions.get("scikit-learn"), path)
            instance._set(estimator=pickle.loads(storage.read("estimator.pkl")))
        return instance


class _ModelWriter(_StageWriter):
    """Params as Spark ML metadata; the ensemble in its own directory beside them."""

    def saveImpl(self, path: str) -> None:
        if self.instance.ensemble is None:
            raise ValueError("cannot save a SparkPartitionEnsembleModel without an ensemble")
        self._save_params(path)
        self.instance.ensemble.save(os.path.join(path, _ENSEMBLE_DIR), spark=self.sparkSession)


class _ModelReader(_StageReader):
    def load(self, path: str) -> SparkPartitionEnsembleModel:
        metadata = self._metadata(path)
        ensemble = load_model(os.path.join(path, _ENSEMBLE_DIR), spark=self.sparkSession)
        return self._with_params(self.cls(ensemble), metadata)


class _Persisted(MLReadable, MLWritable):
    """Spark ML persistence (`write`/`read`, and so `save`/`load` and Pipeline saves) by
    the stage's `_writer` and `_reader`, on a classic session."""

    _writer: type[_StageWriter]
    _reader: type[_StageReader]

    def write(self) -> MLWriter:
        _require_classic_persistence(self)
        return self._writer(self)

    @classmethod
    def read(cls) -> MLReader:
        _require_classic_persistence(cls)
        return cls._reader(cls)


class SparkPartitionEnsemble(Estimator, _PartitionEnsembleParams, _Persisted):
    """Spark ML Estimator: one scikit-learn/XGBoost model per partition.

    >>> ensemble = SparkPartitionEnsemble(estimator=XGBClassifier(), nEstimators=8)
    >>> model = Pipeline(stages=[VectorAssembler(...), ensemble]).fit(df)
    """

    _writer = _EstimatorWriter
    _reader = _EstimatorReader

    @_stage_keywords
    def __init__(self, **params: Any) -> None:
        super().__init__()
        self._set(**self._input_kwargs)

    @_stage_keywords
    def setParams(self, **params: Any) -> SparkPartitionEnsemble:
        """Set any of the Params by keyword."""
        return self._set(**self._input_kwargs)

    def setEstimator(self, value: Any) -> SparkPartitionEnsemble:
        return self._set(estimator=value)

    def setNEstimators(self, value: int) -> SparkPartitionEnsemble:
        return self._set(nEstimators=value)

    def _fit(self, dataset: Any) -> SparkPartitionEnsembleModel:
        if self._get_or_none("estimator") is None:
            raise ValueError(
                "SparkPartitionEnsemble needs estimator=... (a scikit-learn or XGBoost model)"
            )
        ensemble = PartitionEnsemble(**self._ensemble_params())
        fitted = ensemble.fit(
            dataset,
            features_col=self.getFeaturesCols() or self.getFeaturesCol(),
            label_col=self.getLabelCol(),
        )
        model = SparkPartitionEnsembleModel(fitted)
        self._copyValues(model)
        return model


class SparkPartitionEnsembleModel(Model, _PartitionEnsembleParams, _Persisted):
    """Spark ML Model: the fitted PartitionEnsembleModel, predicting with a pandas UDF."""

    _writer = _ModelWriter
    _reader = _ModelReader

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
