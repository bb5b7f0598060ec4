"""Prediction on Spark (transform) equals prediction on pandas."""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
from helpers import frame
from sklearn.datasets import load_diabetes
from sklearn.linear_model import Ridge
from xgboost import XGBRegressor

from sparkdist.ensemble import PartitionEnsemble

# Classes defined here travel to the executors by value (they cannot import this module).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# --- prediction on Spark equals prediction on pandas ---------------------------------------


def test_transform_equals_pandas_predict_vector_column(cancer_model, cancer_df):
    out = cancer_model.transform(cancer_df).select("features", "prediction", "probability")
    result = out.toPandas()
    X = np.stack([v.toArray() for v in result["features"]])
    np.testing.assert_array_equal(result["prediction"].to_numpy(), cancer_model.predict(X))
    probability = np.stack([v.toArray() for v in result["probability"]])
    np.testing.assert_allclose(probability, cancer_model.predict_proba(X), rtol=1e-12)
    # A pandas frame with the vector column predicts the same (as MLflow's pyfunc would).
    np.testing.assert_array_equal(cancer_model.predict(result), cancer_model.predict(X))


def test_transform_equals_pandas_predict_columns(spark, digits_xgb_model, digits):
    X, y = digits
    data = frame(X, y)
    result = digits_xgb_model.transform(spark.createDataFrame(data)).toPandas()
    np.testing.assert_array_equal(
        result["prediction"].to_numpy(), digits_xgb_model.predict(data).astype(float)
    )
    probability = np.stack([v.toArray() for v in result["probability"]])
    np.testing.assert_allclose(probability, digits_xgb_model.predict_proba(data), rtol=1e-6)


class CountingModel:
    """Wraps a fitted model; every unpickling adds 1 to a Spark accumulator."""

    def __init__(self, inner, counter) -> None:
        self.inner = inner
        self.counter = counter

    def __setstate__(self, state) -> None:
        self.__dict__.update(state)
        self.counter.add(1)

    def predict_proba(self, X):
        return self.inner.predict_proba(X)


def test_transform_unpickles_the_models_once_per_task_not_per_batch(spark, cancer_model, cancer_df):
    counter = spark.sparkContext.accumulator(0)
    model = cloudpickle.loads(cloudpickle.dumps(cancer_model))
    model.estimators_[0] = CountingModel(model.estimators_[0], counter)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "20")
    try:
        rows = model.transform(cancer_df).select("prediction").collect()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    tasks = cancer_df.rdd.getNumPartitions()
    assert len(rows) == cancer_df.count() and len(rows) / 20 > 3 * tasks
    assert counter.value == tasks


def test_regression_matches_one_model_and_transform_equals_predict(spark):
    X, y = load_diabetes(return_X_y=True)
    data = frame(X, y)
    columns = [c for c in data.columns if c != "label"]
    df = spark.createDataFrame(data)
    single = Ridge(alpha=0.1).fit(X, y).score(X, y)
    model = PartitionEnsemble(Ridge(alpha=0.1), n_estimators=3, random_state=0).fit(
        df, features_col=columns
    )
    assert not hasattr(model, "classes_")
    assert model.score(data, y) >= single - 0.02
    result = model.transform(df).toPandas()
    assert "probability" not in result.columns
    np.testing.assert_allclose(result["prediction"], model.predict(data), rtol=1e-9)
    boosted = PartitionEnsemble(
        XGBRegressor(n_estimators=50, max_depth=2, n_jobs=1),
        n_estimators=2,
        weights="validation",
        random_state=0,
    ).fit(df, features_col=columns)
    assert boosted.score(data, y) > 0.4
    assert all(s.validation_score is not None for s in boosted.estimators_stats_)
