"""The fitted partition ensemble: K independent models that predict together.

Classifiers vote: "soft" averages the models' probabilities, "hard" counts their predicted
classes; regressors average predictions. Each model's outputs are first mapped into the
global class order (a model whose partition lacked a class gives it probability 0). The
object holds only plain models and arrays, so it pickles with cloudpickle for MLflow and
is shipped once per task for Spark prediction, where it adds its columns with a pandas
UDF (pyspark's public API, imported on first use).
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import cloudpickle
import numpy as np
import pandas as pd

from sparkdist.ensemble.model.features import FeatureSpec, resolve_features, rows_to_matrix
from sparkdist.ensemble.model.persistence import read_model, save_model
from sparkdist.ensemble.model.stats import EstimatorStats

logger = logging.getLogger(__name__)


class PartitionEnsembleModel:
    """K models, one per partition, combined by voting (classifiers) or averaging.

    Fitted attributes follow scikit-learn's bagging: `estimators_`, `estimators_features_`
    (the feature indexes each model uses), `classes_` (classifiers), `weights_` (the
    combination weights, summing to 1) and `estimators_stats_` (rows seen, classes seen,
    validation score and fit seconds of each model).
    """

    def __init__(
        self,
        *,
        estimators: Sequence[Any],
        estimators_features: Sequence[np.ndarray],
        estimators_stats: Sequence[EstimatorStats],
        features: FeatureSpec,
        label_col: str,
        classes: np.ndarray | None,
        voting: str = "soft",
        weighting: str = "uniform",
        weights: np.ndarray | None = None,
        label_is_numeric: bool = True,
        params: dict[str, Any] | None = None,
    ) -> None:
        if not estimators:
            raise ValueError("an ensemble needs at least one fitted model")
        self.estimators_ = list(estimators)
        self.estimators_features_ = [np.asarray(f, dtype=np.int64) for f in estimators_features]
        self.estimators_stats_ = list(estimators_stats)
        self.features_ = features
        self.n_features_in_ = features.n_features
        if features.feature_cols is not None:
            self.feature_names_in_ = np.asarray(features.feature_cols, dtype=object)
        self.label_col = label_col
        self.label_is_numeric = label_is_numeric
        self.is_classifier = classes is not None
        if classes is not None:
            self.classes_ = np.asarray(classes)
        self.voting = voting
        self.weighting = weighting
        self.weights_ = (
            combination_weights(self.estimators_stats_, weighting) if weights is None else weights
        )
        self.params = dict(params or {})

    @property
    def n_estimators_(self) -> int:
        """Models actually in the ensemble (fewer than asked if some got no rows)."""
        return len(self.estimators_)

    def stats_frame(self) -> pd.DataFrame:
        """The per-model statistics as a table, one row per model."""
        return pd.DataFrame([stats.to_dict() for stats in self.estimators_stats_])

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities in `classes_` order: the weighted mean of the models'
        probabilities (soft voting) or the weighted share of votes (hard voting)."""
        if not self.is_classifier:
            raise AttributeError("predict_proba is for classifiers; this ensemble is a regressor")
        return self._proba(self.features_.matrix(X))

    def predict(self, X: Any) -> np.ndarray:
        """Predicted classes (classifiers) or the weighted mean prediction (regressors)."""
        matrix = self.features_.matrix(X)
        if self.is_classifier:
            return self.classes_[np.argmax(self._proba(matrix), axis=1)]
        return self._regress(matrix)

    def score(self, X: Any, y: Any) -> float:
        """Accuracy (classifiers) or R² (regressors), as scikit-learn's `score`."""
        from sklearn.metrics import accuracy_score, r2_score

        predicted = self.predict(X)
        if self.is_classifier:
            return float(accuracy_score(np.asarray(y), predicted))
        return float(r2_score(np.asarray(y), predicted))

    def transform(
        self,
        df: Any,
        prediction_col: str = "prediction",
        probability_col: str | None = "probability",
    ) -> Any:
        """`df` plus a prediction column (and a probability vector column for classifiers).

        Predicts on the executors with an iterator pandas UDF: the ensemble travels in the
        UDF's closure as bytes and is unpickled once per task, then reused for every batch.
        Predictions equal `predict` on the same rows.
        """
        spec = self.features_
        resolve_features(
            df.schema, spec.features_col if spec.features_col else list(spec.feature_cols)
        )
        outputs = [prediction_col] + (
            [probability_col] if self.is_classifier and probability_col else []
        )
        clashing = [name for name in outputs if name in df.columns]
        if clashing:
            raise ValueError(
                f"output column(s) {clashing} already exist in the DataFrame; choose other "
                "names (prediction_col=..., probability_col=...)"
            )
        features = spec.spark_array(df.schema)
        payload = cloudpickle.dumps(self)
        if not self.is_classifier:
            return _with_regression(df, features, _regression_udf(payload), prediction_col)
        label_type = "double" if self.label_is_numeric else "string"
        classify = _classification_udf(payload)
        return _with_classification(
            df, features, classify, label_type, prediction_col, probability_col
        )

    def save(self, path: str, *, overwrite: bool = False, spark: Any = None) -> None:
        """Save to a directory: local, or any filesystem Spark can write (hdfs://, dbfs:/...)."""
        save_model(self, path, overwrite=overwrite, spark=spark)

    @classmethod
    def load(cls, path: str, *, spark: Any = None) -> PartitionEnsembleModel:
        """Load a model saved with `save`."""
        return cls(**read_model(path, spark=spark))

    def __repr__(self) -> str:
        kind = f"{len(self.classes_)} classes" if self.is_classifier else "regression"
        return (
            f"PartitionEnsembleModel({self.n_estimators_} models, {kind}, "
            f"{self.n_features_in_} features)"
        )

    def _proba(self, X: np.ndarray) -> np.ndarray:
        proba = np.zeros((X.shape[0], len(self.classes_)))
        rows = np.arange(X.shape[0])
        for estimator, columns, stats, weight in self._members():
            class_indices = np.asarray(stats.class_indices, dtype=np.int64)
            X_model = _columns(X, columns, self.n_features_in_)
            if self.voting == "soft":
                proba[:, class_indices] += weight * estimator.predict_proba(X_model)
            else:
                votes = np.asarray(estimator.predict(X_model), dtype=np.int64)
                proba[rows, class_indices[votes]] += weight
        return proba

    def _regress(self, X: np.ndarray) -> np.ndarray:
        total = np.zeros(X.shape[0])
        for estimator, columns, _stats, weight in self._members():
            total += weight * np.asarray(
                estimator.predict(_columns(X, columns, self.n_features_in_)), dtype=np.float64
            )
        return total

    def _members(self) -> Iterator[tuple[Any, np.ndarray, EstimatorStats, float]]:
        return zip(
            self.estimators_,
            self.estimators_features_,
            self.estimators_stats_,
            self.weights_,
            strict=True,
        )


def load_model(path: str, *, spark: Any = None) -> PartitionEnsembleModel:
    """Load a model saved with `PartitionEnsembleModel.save`."""
    return PartitionEnsembleModel.load(path, spark=spark)


def combination_weights(stats: Sequence[EstimatorStats], weighting: str) -> np.ndarray:
    """Weights summing to 1: equal, or proportional to each model's validation score.

    Negative scores (an R² below 0 is worse than predicting the mean) count as 0; a model
    without a score (its partition was too small to hold rows out) gets 0 too.
    """
    uniform = np.full(len(stats), 1.0 / len(stats))
    if weighting == "uniform":
        return uniform
    scores = np.array(
        [0.0 if s.validation_score is None else max(s.validation_score, 0.0) for s in stats]
    )
    unscored = [s.model_index for s in stats if s.validation_score is None]
    if unscored:
        logger.warning("models %s have no validation score and get weight 0", unscored)
    if scores.sum() <= 0.0:
        logger.warning("no model has a positive validation score; weighting them equally")
        return uniform
    return scores / scores.sum()


def _columns(X: np.ndarray, columns: np.ndarray, n_features: int) -> np.ndarray:
    return X if len(columns) == n_features else X[:, columns]


def _with_regression(df: Any, features: Any, predict: Callable, prediction_col: str) -> Any:
    """`df` plus `prediction_col`, a double that the iterator pandas UDF `predict` gives
    for the `features` expression."""
    from pyspark.sql.functions import pandas_udf

    return df.withColumn(prediction_col, pandas_udf(predict, "double")(features))


def _with_classification(
    df: Any,
    features: Any,
    classify: Callable,
    label_type: str,
    prediction_col: str,
    probability_col: str | None,
) -> Any:
    """`df` plus `prediction_col` (of `label_type`) and, if named, `probability_col` (a
    Spark ML vector), from the iterator pandas UDF `classify`, which yields frames of
    (prediction, probability array) for the `features` expression."""
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F
    from pyspark.sql.functions import pandas_udf

    scratch = "__sparkdist_output"
    udf = pandas_udf(classify, f"prediction {label_type}, probability array<double>")
    out = df.withColumn(scratch, udf(features))
    out = out.withColumn(prediction_col, F.col(f"{scratch}.prediction"))
    if probability_col:
        out = out.withColumn(probability_col, array_to_vector(F.col(f"{scratch}.probability")))
    return out.drop(scratch)


def _classification_udf(payload: bytes) -> Any:
    def predict(batches: Iterator[pd.Series]) -> Iterator[pd.DataFrame]:
        model = pickle.loads(payload)  # once per task, not per batch
        for batch in batches:
            proba = model._proba(rows_to_matrix(batch, model.n_features_in_))
            predicted = model.classes_[np.argmax(proba, axis=1)]
            if model.label_is_numeric:
                predicted = predicted.astype(np.float64)
            yield pd.DataFrame({"prediction": predicted, "probability": list(proba)})

    return predict


def _regression_udf(payload: bytes) -> Any:
    def predict(batches: Iterator[pd.Series]) -> Iterator[pd.Series]:
        model = pickle.loads(payload)  # once per task, not per batch
        for batch in batches:
            yield pd.Series(model._regress(rows_to_matrix(batch, model.n_features_in_)))

    return predict
