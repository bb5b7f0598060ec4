"""Partition ensemble against one model on all the data, on a generated dataset.

The data is made on the driver and handed to Spark as a DataFrame; the ensemble trains
one XGBoost model per partition on the executors, the single model trains in this
process on every row. Both are scored on the same held-out rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

N_FEATURES = 20


def make_data(n_rows: int = 20_000, n_test: int = 5_000, seed: int = 0):
    """(train frame, test frame, feature names): a 2-class problem with 20 features."""
    import pandas as pd
    from sklearn.datasets import make_classification

    x, y = make_classification(
        n_samples=n_rows + n_test,
        n_features=N_FEATURES,
        n_informative=10,
        n_redundant=4,
        flip_y=0.02,
        random_state=seed,
    )
    features = [f"f{i}" for i in range(N_FEATURES)]
    frame = pd.DataFrame(x, columns=features)
    frame["label"] = y
    return frame.iloc[:n_rows], frame.iloc[n_rows:], features


def xgboost_model() -> Any:
    from xgboost import XGBClassifier

    return XGBClassifier(n_estimators=60, max_depth=5, learning_rate=0.3, n_jobs=1)


@dataclass
class EnsembleResult:
    ensemble: Any
    ensemble_accuracy: float
    ensemble_seconds: float
    single_accuracy: float
    single_seconds: float


def ensemble_vs_one_model(spark, n_estimators: int = 4, n_rows: int = 20_000) -> EnsembleResult:
    """Fit a partition ensemble on Spark and one model locally; score both."""
    from sparkdist.ensemble import PartitionEnsemble

    train, test, features = make_data(n_rows)
    df = spark.createDataFrame(train)
    started = time.monotonic()
    ensemble = PartitionEnsemble(
        estimator=xgboost_model(), n_estimators=n_estimators, random_state=0
    ).fit(df, features_col=features, label_col="label")
    ensemble_seconds = time.monotonic() - started
    ensemble_accuracy = ensemble.score(test[features], test["label"])

    started = time.monotonic()
    single = xgboost_model().fit(train[features], train["label"])
    single_seconds = time.monotonic() - started
    single_accuracy = float((single.predict(test[features]) == test["label"]).mean())
    return EnsembleResult(
        ensemble, ensemble_accuracy, ensemble_seconds, single_accuracy, single_seconds
    )
