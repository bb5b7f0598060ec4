"""A fitted partition ensemble logged as an mlflow.pyfunc model, against a real server."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.tree import DecisionTreeClassifier
from xgboost import XGBClassifier

from sparkdist.ensemble import PartitionEnsemble, log_ensemble


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


def test_a_model_logged_before_the_flavor_moved_still_loads(spark, named_cancer, driver_mlflow):
    """An ensemble logged when the flavor lived in `sparkdist.tracking` stores a pyfunc script
    that imports its artifact key from `sparkdist.tracking.ensemble_flavor`: it still loads
    where this sparkdist is already imported; the old name `sparkdist.tracking.log_ensemble`
    still logs, with a DeprecationWarning that names the new one."""
    import mlflow
    from mlflow.artifacts import download_artifacts

    import sparkdist.tracking

    df, frame, features = named_cancer
    model = PartitionEnsemble(
        estimator=DecisionTreeClassifier(max_depth=3), n_estimators=2, random_state=0
    ).fit(df, features_col=features, label_col="target")
    with pytest.warns(DeprecationWarning, match="sparkdist.ensemble.log_ensemble"):
        old_name = sparkdist.tracking.log_ensemble
    assert old_name is log_ensemble
    with mlflow.start_run():
        info = old_name(model, "ensemble")
    local = Path(download_artifacts(info.model_uri))
    scripts = [  # the model's own script, not the copy of sparkdist logged beside it
        p for p in local.rglob("*.py") if "set_model(" in p.read_text() and "code" not in p.parts
    ]
    assert len(scripts) == 1, scripts
    new_import = "from sparkdist.ensemble.mlflow_flavor import ARTIFACT_KEY"
    assert new_import in scripts[0].read_text()
    old_import = "from sparkdist.tracking.ensemble_flavor import ARTIFACT_KEY"
    scripts[0].write_text(scripts[0].read_text().replace(new_import, old_import))
    loaded = mlflow.pyfunc.load_model(str(local))
    expected = model.predict(frame[features])
    assert np.array_equal(np.asarray(loaded.predict(frame[features])), expected)
