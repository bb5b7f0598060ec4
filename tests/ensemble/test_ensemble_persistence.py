"""Saving and loading an ensemble, the Spark ML pair inside a Pipeline, and the one
parameter table both share."""

from __future__ import annotations

import json
import os

import cloudpickle
import numpy as np
import pandas as pd
import pytest
from ensemble_data import logistic, xgb_classifier
from helpers import frame, pipeline_saved_and_loaded
from xgboost import XGBClassifier

from sparkdist.ensemble import (
    PartitionEnsemble,
    PartitionEnsembleModel,
    SparkPartitionEnsemble,
    SparkPartitionEnsembleModel,
    VersionMismatchError,
)

# --- save and load -------------------------------------------------------------------------


def test_save_load_local_round_trip(tmp_path, cancer_model, cancer):
    X, _ = cancer
    path = str(tmp_path / "ensemble")
    cancer_model.save(path)
    manifest = json.loads((tmp_path / "ensemble" / "manifest.json").read_text())
    assert manifest["versions"]["scikit-learn"]
    assert [e["file"] for e in manifest["estimators"]] == [
        f"estimators/0000{i}.pkl" for i in range(4)
    ]
    loaded = PartitionEnsembleModel.load(path)
    np.testing.assert_array_equal(loaded.predict_proba(X), cancer_model.predict_proba(X))
    assert [s.to_dict() for s in loaded.estimators_stats_] == [
        s.to_dict() for s in cancer_model.estimators_stats_
    ]
    with pytest.raises(FileExistsError, match="overwrite=True"):
        cancer_model.save(path)
    cancer_model.save(path, overwrite=True)


def test_save_through_spark_filesystem_xgboost_json(spark, tmp_path, digits_xgb_model, digits):
    X, _ = digits
    uri = "file://" + str(tmp_path / "xgb")
    digits_xgb_model.save(uri, spark=spark)  # through Hadoop's FileSystem API
    files = sorted(f for f in os.listdir(tmp_path / "xgb" / "estimators") if f[0] != ".")
    assert files == ["00000.json", "00001.json"]
    booster = XGBClassifier()
    booster.load_model(str(tmp_path / "xgb" / "estimators" / "00000.json"))
    np.testing.assert_allclose(
        booster.predict_proba(X), digits_xgb_model.estimators_[0].predict_proba(X), rtol=1e-6
    )
    for loaded in (
        PartitionEnsembleModel.load(uri, spark=spark),  # through Spark
        PartitionEnsembleModel.load(str(tmp_path / "xgb")),  # plain local read
    ):
        np.testing.assert_allclose(
            loaded.predict_proba(X), digits_xgb_model.predict_proba(X), rtol=1e-6
        )


def test_load_refuses_another_sklearn_version(tmp_path, cancer_model):
    path = tmp_path / "ensemble"
    cancer_model.save(str(path))
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["versions"]["scikit-learn"] = "0.24.2"
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(VersionMismatchError, match=r"scikit-learn 0\.24\.2.*scikit-learn==0\.24"):
        PartitionEnsembleModel.load(str(path))


def test_load_missing_path_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="no saved partition ensemble"):
        PartitionEnsembleModel.load(str(tmp_path / "nothing"))


def test_remote_scheme_without_spark_is_clear(cancer_model, monkeypatch):
    from pyspark.sql import SparkSession

    monkeypatch.setattr(SparkSession, "getActiveSession", classmethod(lambda cls: None))
    with pytest.raises(ValueError, match="'hdfs' filesystem.*SparkSession"):
        cancer_model.save("hdfs://namenode:8020/models/x")


def test_model_pickles_for_mlflow(cancer_model, cancer):
    X, _ = cancer
    frame_in = pd.DataFrame({"features": list(X)})
    restored = cloudpickle.loads(cloudpickle.dumps(cancer_model))
    np.testing.assert_array_equal(restored.predict(frame_in), cancer_model.predict(X))


# --- Spark ML pair inside a Pipeline -------------------------------------------------------


def test_spark_ml_pipeline_fit_save_load(spark, tmp_path, cancer):
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler

    X, y = cancer
    data = frame(X, y)
    columns = [c for c in data.columns if c != "label"]
    df = spark.createDataFrame(data)
    stage = SparkPartitionEnsemble(
        estimator=xgb_classifier(), nEstimators=2, seed=5, probabilityCol="p"
    )
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=columns, outputCol="features"), stage])
    pipeline.write().save(str(tmp_path / "pipeline"))
    reloaded = Pipeline.load(str(tmp_path / "pipeline"))
    assert isinstance(reloaded.getStages()[1].getEstimator(), XGBClassifier)
    assert reloaded.getStages()[1].getNEstimators() == 2

    fitted = reloaded.fit(df)
    ensemble_stage = fitted.stages[1]
    assert isinstance(ensemble_stage, SparkPartitionEnsembleModel)
    assert ensemble_stage.ensemble.n_estimators_ == 2
    before = fitted.transform(df).select("label", "prediction", "p").toPandas()
    assert (before["prediction"] == before["label"]).mean() > 0.95

    loaded, after = pipeline_saved_and_loaded(fitted, df, before, tmp_path / "model")
    np.testing.assert_array_equal(
        after["prediction"], loaded.stages[1].ensemble.predict(data[columns])
    )


def test_one_parameter_table_for_sklearn_and_spark_ml():
    import inspect

    from sparkdist.ensemble.params import ENSEMBLE_PARAMS

    spark_names = {
        "estimator": "estimator",
        "n_estimators": "nEstimators",
        "max_samples": "maxSamples",
        "bootstrap": "bootstrap",
        "max_features": "maxFeatures",
        "voting": "voting",
        "weights": "weights",
        "validation_fraction": "validationFraction",
        "random_state": "seed",
        "shuffle": "shuffle",
    }
    defaults = {
        "estimator": None,
        "n_estimators": 8,
        "max_samples": 1.0,
        "bootstrap": False,
        "max_features": 1.0,
        "voting": "soft",
        "weights": "uniform",
        "validation_fraction": None,
        "random_state": None,
        "shuffle": True,
    }
    assert {p.name: p.spark_name for p in ENSEMBLE_PARAMS} == spark_names
    assert {p.name: p.default for p in ENSEMBLE_PARAMS} == defaults
    # scikit-learn's signature (get_params reads it): the table's names, order and defaults.
    sklearn = inspect.signature(PartitionEnsemble).parameters
    assert list(sklearn) == [p.name for p in ENSEMBLE_PARAMS]
    assert {name: p.default for name, p in sklearn.items()} == defaults
    assert PartitionEnsemble().get_params() == defaults

    # Spark ML: a Param, a getter and a default per entry; the keyword signature of
    # __init__ and setParams names every Param with its default.
    stage = SparkPartitionEnsemble()
    for param in ENSEMBLE_PARAMS:
        spark_param = stage.getParam(param.spark_name)
        assert spark_param.doc == param.doc
        assert stage.isDefined(spark_param) is (param.default is not None)
        getter = "get" + param.spark_name[0].upper() + param.spark_name[1:]
        assert getattr(stage, getter)() == param.default
    for method in (SparkPartitionEnsemble, SparkPartitionEnsemble.setParams):
        keywords = dict(inspect.signature(method).parameters)
        keywords.pop("self", None)
        assert {p.kind for p in keywords.values()} == {inspect.Parameter.KEYWORD_ONLY}
        assert set(keywords) == {p.name for p in stage.params}
        for param in stage.params:
            default = stage.getOrDefault(param) if stage.isDefined(param) else None
            assert keywords[param.name].default == default, param.name
    assert [stage.getBootstrap(), stage.getShuffle()] == [False, True]  # bools, not 0/1
    assert type(stage.getNEstimators()) is int and type(stage.getMaxSamples()) is float


def test_spark_ml_stage_takes_its_params_by_keyword_only():
    stage = SparkPartitionEnsemble(nEstimators=3, seed=2**40 + 5, featuresCols=["a", "b"])
    assert stage._input_kwargs == {"nEstimators": 3, "seed": 2**40 + 5, "featuresCols": ["a", "b"]}
    assert (stage.getNEstimators(), stage.getSeed(), stage.getFeaturesCols()) == (
        3,
        2**40 + 5,
        ["a", "b"],
    )
    assert stage._ensemble_params()["random_state"] == 5  # a Spark ML seed cut to 31 bits
    assert stage.setParams(maxSamples=0.5) is stage and stage.getMaxSamples() == 0.5
    assert stage._input_kwargs == {"maxSamples": 0.5} and stage.getNEstimators() == 3
    assert stage._json_param_map() == {
        "nEstimators": 3,
        "seed": 2**40 + 5,
        "featuresCols": ["a", "b"],
        "maxSamples": 0.5,
    }
    with pytest.raises(TypeError, match="unexpected keyword argument 'nEstimator'"):
        SparkPartitionEnsemble(nEstimator=3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_estimators'"):
        stage.setParams(n_estimators=3)
    with pytest.raises(TypeError, match="forces keyword arguments"):
        SparkPartitionEnsemble(logistic())
