"""The partition ensemble tests' data and fitted models, built once for all their modules
(on the session's Spark, tests/conftest.py; `cancer` and `cancer_df` are the compatibility
suite's too, in tests/helpers.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from ensemble_data import logistic, write_parquet_files, xgb_classifier
from helpers import frame
from sklearn.datasets import load_digits

from sparkdist.ensemble import PartitionEnsemble, PartitionEnsembleModel


@pytest.fixture(scope="session")
def digits():
    X, y = load_digits(return_X_y=True)
    return X, y


@pytest.fixture(scope="session")
def cancer_model(cancer_df) -> PartitionEnsembleModel:
    return PartitionEnsemble(logistic(), n_estimators=4, random_state=7).fit(cancer_df)


@pytest.fixture(scope="session")
def digits_xgb_model(spark, digits) -> PartitionEnsembleModel:
    X, y = digits
    data = frame(X, y)
    df = spark.createDataFrame(data)
    columns = [c for c in data.columns if c != "label"]
    ensemble = PartitionEnsemble(xgb_classifier(), n_estimators=2, random_state=3)
    return ensemble.fit(df, features_col=columns, label_col="label")


@pytest.fixture(scope="session")
def cancer_parquet(tmp_path_factory, cancer):
    X, y = cancer
    return write_parquet_files(tmp_path_factory.mktemp("cancer") / "data", frame(X, y))


@pytest.fixture(scope="session")
def small_df(spark):
    rng = np.random.default_rng(0)
    data = pd.DataFrame(rng.normal(size=(60, 3)), columns=["a", "b", "c"])
    data["label"] = (data["a"] > 0).astype(float)
    data["name"] = "x"
    return spark.createDataFrame(data)
