"""Where an ensemble's features come from, on Spark and on numpy/pandas.

Features are either one Spark ML vector column (VectorAssembler output) or an array
column, or a list of numeric columns. Training and Spark prediction turn both into one
`array<double>` column, so executors see a single Arrow list they can reshape without
per-row Python objects; pandas prediction picks the same columns in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from sparkdist.spark import columns


@dataclass(frozen=True)
class FeatureSpec:
    """The feature source of a fitted ensemble: one vector column or named numeric columns."""

    n_features: int
    features_col: str | None = None
    feature_cols: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if (self.features_col is None) == (self.feature_cols is None):
            raise ValueError("a FeatureSpec has either features_col or feature_cols, not both")

    @property
    def input_columns(self) -> list[str]:
        """The DataFrame columns the features are read from."""
        return [self.features_col] if self.features_col is not None else list(self.feature_cols)

    def spark_array(self, schema: Any, element: str = "double") -> Any:
        """A Spark column expression giving the features as `array<double>` (or `<float>`)
        of a DataFrame of `schema`."""
        one_column = self.features_col is not None
        return columns.features_array(schema, self.input_columns, one_column, element)

    def training_element(self, schema: Any, estimator: Any) -> str:
        """ "float" when shipping float32 to the training tasks loses nothing, else "double".

        Float32 halves the shuffle and the Arrow transfer. It is lossless when every source
        value is exactly a float32 (float, byte, short, boolean columns or arrays), or when
        the estimator converts its input to float32 itself: XGBoost, and scikit-learn's
        trees, forests and gradient boosting, round to nearest exactly as Spark's cast does.
        """
        if _fits_on_float32(estimator):
            return "float"
        exact = all(columns.holds_exact_float32(schema, name) for name in self.input_columns)
        return "float" if exact else "double"

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_features": self.n_features,
            "features_col": self.features_col,
            "feature_cols": None if self.feature_cols is None else list(self.feature_cols),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FeatureSpec:
        cols = data.get("feature_cols")
        return cls(
            n_features=int(data["n_features"]),
            features_col=data.get("features_col"),
            feature_cols=None if cols is None else tuple(cols),
        )

    def matrix(self, X: Any) -> np.ndarray:
        """Features as a float64 matrix from a numpy array or a pandas DataFrame.

        A DataFrame is read by column name: the fitted feature columns, or the fitted
        vector/array column (values may be lists, arrays or Spark ML vectors). A
        DataFrame without those columns but with exactly `n_features` columns is taken
        in its column order, which is what a 2-D numpy array means too.
        """
        if isinstance(X, pd.DataFrame):
            matrix = self._matrix_from_frame(X)
        else:
            matrix = np.asarray(X, dtype=np.float64)
            if matrix.ndim == 1:
                matrix = matrix.reshape(1, -1)
        if matrix.ndim != 2 or matrix.shape[1] != self.n_features:
            raise ValueError(
                f"expected {self.n_features} features per row, got an array of shape {matrix.shape}"
            )
        return matrix

    def _matrix_from_frame(self, frame: pd.DataFrame) -> np.ndarray:
        if self.feature_cols is not None:
            missing = [name for name in self.feature_cols if name not in frame.columns]
            if not missing:
                return frame[list(self.feature_cols)].to_numpy(dtype=np.float64)
        elif self.features_col in frame.columns:
            return rows_to_matrix(frame[self.features_col], self.n_features)
        else:
            missing = [self.features_col]
        if frame.shape[1] == self.n_features:
            return frame.to_numpy(dtype=np.float64)
        raise ValueError(
            f"the DataFrame lacks the feature column(s) {missing} and does not have exactly "
            f"{self.n_features} columns to use in order; it has {list(frame.columns)}"
        )


def _fits_on_float32(estimator: Any) -> bool:
    """Whether the estimator turns its training and prediction input into float32 itself."""
    for cls in type(estimator).__mro__:
        if cls.__module__.startswith("xgboost.") and cls.__name__ == "XGBModel":
            return True
    try:
        from sklearn.ensemble._forest import BaseForest
        from sklearn.ensemble._gb import BaseGradientBoosting
        from sklearn.tree import BaseDecisionTree
    except ImportError:  # private modules moved: assume nothing
        return False
    return isinstance(estimator, BaseDecisionTree | BaseForest | BaseGradientBoosting)


def rows_to_matrix(values: pd.Series | Sequence[Any], n_features: int) -> np.ndarray:
    """Stack a column of per-row vectors (arrays, lists or Spark ML vectors) into a matrix."""
    rows = [v.toArray() if hasattr(v, "toArray") else v for v in values]
    if not rows:
        return np.empty((0, n_features), dtype=np.float64)
    return np.asarray(np.stack(rows), dtype=np.float64)


def resolve_features(schema: Any, features_col: str | Sequence[str]) -> FeatureSpec:
    """Check the feature column(s) against the schema; the feature count comes later.

    A string names one column: a Spark ML vector, an array of numbers, or one numeric
    column; a list names numeric columns. Returns a spec with n_features 0 for a vector or
    array column (its size is only known from the data).
    """
    if isinstance(features_col, str):
        require_columns(schema, [features_col], "feature")
        kind = columns.kind(schema, features_col)
        if kind == columns.VECTOR:
            return FeatureSpec(n_features=0, features_col=features_col)
        if kind == columns.ARRAY:
            if columns.element_kind(schema, features_col) != columns.NUMBER:
                raise ValueError(
                    f"feature column '{features_col}' is an array of "
                    f"{columns.type_name(schema, features_col, element=True)}; features "
                    "must be numbers"
                )
            return FeatureSpec(n_features=0, features_col=features_col)
        features_col = [features_col]
    names = list(features_col)
    if not names:
        raise ValueError("features_col names no columns; pass a vector column or a list")
    if len(set(names)) != len(names):
        raise ValueError(f"features_col lists a column twice: {names}")
    require_columns(schema, names, "feature")
    for name in names:
        if columns.kind(schema, name) != columns.NUMBER:
            raise ValueError(
                f"feature column '{name}' has type {columns.type_name(schema, name)}; "
                "features must be "
                "numeric: cast it, or encode it (StringIndexer, OneHotEncoder) and assemble "
                "the features with VectorAssembler"
            )
    return FeatureSpec(n_features=len(names), feature_cols=tuple(names))


def require_columns(schema: Any, names: Sequence[str], role: str) -> None:
    """A ValueError naming the `role` columns (feature, label) missing from `schema`."""
    missing = [name for name in names if name not in schema.fieldNames()]
    if missing:
        raise ValueError(
            f"{role} column(s) {missing} not in the DataFrame; its columns are "
            f"{schema.fieldNames()}"
        )
