"""A fitted partition ensemble logged as an mlflow.pyfunc model, against a real server."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.tree import DecisionTreeClassifier
from xgboost import XGBClassifier

from sparkdist.ensemble import PartitionEnsemble
from sparkdist.tracking import log_ensemble


@pytest.fixture(scope="module")
def named_cancer(spark):
    data = load_breast_cancer(as_frame=True)
    frame = data.frame.rename(columns=lambda c: c.replace(" ", "_"))
    features = [c for c in frame.columns if c != "target"]
    return spark.createDataFrame(frame), frame, features


@pytest.mark.parametrize(
    "estimator", [DecisionTreeClassifier(max_depth=4), XGBClassifier(n_estimators=20)]
)
def test_pyfunc_and_spark_udf_match_the_model(spark, named_cancer, driver_mlflow, estimator):
    import mlflow
    from mlflow import MlflowClient

    df, frame, features = named_cancer
    model = PartitionEnsemble(estimator=estimator, n_estimators=2, random_state=0).fit(
        df, features_col=features, label_col="target"
    )
    with mlflow.start_run() as run:
        info = log_ensemble(model, "ensemble")
    expected = model.predict(frame[features])

    loaded = mlflow.pyfunc.load_model(info.model_uri)
    assert np.array_equal(np.asarray(loaded.predict(frame[features])), expected)
    assert info.signature is not None and len(info.signature.inputs.inputs) == len(features)

    udf = mlflow.pyfunc.spark_udf(spark, info.model_uri, env_manager="local")
    scored = df.withColumn("udf_prediction", udf(*features)).toPandas()
    assert np.array_equal(scored["udf_prediction"].to_numpy(), expected)
    transformed = model.transform(df).select("prediction").toPandas()["prediction"].to_numpy()
    assert np.array_equal(transformed, expected)

    data = MlflowClient().get_run(run.info.run_id).data
    assert data.metrics["ensemble.n_estimators"] == model.n_estimators_
    artifacts = [a.path for a in MlflowClient().list_artifacts(run.info.run_id)]
    assert "sparkdist_ensemble_stats.json" in artifacts
    table = mlflow.load_table("sparkdist_ensemble_stats.json", run_ids=[run.info.run_id])
    assert isinstance(table, pd.DataFrame) and len(table) == model.n_estimators_
