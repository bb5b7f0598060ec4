"""Where an ensemble's features and label come from, on Spark and on numpy/pandas.

Features are either one Spark ML vector column (VectorAssembler output) or an array
column, or a list of numeric columns. Training and Spark prediction turn both into one
`array<double>` column, so executors see a single Arrow list they can reshape without
per-row Python objects; pandas prediction picks the same columns in the same order.

The columns' Spark types are read here, and nowhere else in the ensemble: the rest reasons
about kinds of column (VECTOR, ARRAY, NUMBER, STRING) and the schema checks that name a
bad column. pyspark (public API only) is imported on first use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

VECTOR, ARRAY, NUMBER, STRING, OTHER = "vector", "array", "number", "string", "other"


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
        return _features_array(schema, self.input_columns, one_column, element)

    def training_element(self, schema: Any, estimator: Any) -> str:
        """ "float" when shipping float32 to the training tasks loses nothing, else "double".

        Float32 halves the shuffle and the Arrow transfer. It is lossless when every source
        value is exactly a float32 (float, byte, short, boolean columns or arrays), or when
        the estimator converts its input to float32 itself: XGBoost, and scikit-learn's
        trees, forests and gradient boosting, round to nearest exactly as Spark's cast does.
        """
        if _fits_on_float32(estimator):
            return "float"
        exact = all(_holds_exact_float32(schema, name) for name in self.input_columns)
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
        kind = column_kind(schema, features_col)
        if kind == VECTOR:
            return FeatureSpec(n_features=0, features_col=features_col)
        if kind == ARRAY:
            if _kind(schema[features_col].dataType.elementType) != NUMBER:
                raise ValueError(
                    f"feature column '{features_col}' is an array of "
                    f"{_type_name(schema, features_col, element=True)}; features "
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
        if column_kind(schema, name) != NUMBER:
            raise ValueError(
                f"feature column '{name}' has type {_type_name(schema, name)}; "
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


def check_label_type(schema: Any, label_col: str, is_classifier: bool) -> bool:
    """Check the label column's type; returns whether it is numeric."""
    require_columns(schema, [label_col], "label")
    kind = column_kind(schema, label_col)
    if kind == NUMBER:
        return True
    if is_classifier and kind == STRING:
        return False
    allowed = "numeric or string" if is_classifier else "numeric"
    raise ValueError(
        f"label column '{label_col}' has type {_type_name(schema, label_col)}; the "
        f"label must be {allowed}"
    )


def column_kind(schema: Any, name: str) -> str:
    """What column `name` of `schema` holds: VECTOR (Spark ML), ARRAY, NUMBER (numeric or
    boolean), STRING or OTHER."""
    return _kind(schema[name].dataType)


def _kind(dtype: Any) -> str:
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T

    if isinstance(dtype, VectorUDT):
        return VECTOR
    if isinstance(dtype, T.ArrayType):
        return ARRAY
    if isinstance(dtype, T.NumericType | T.BooleanType):
        return NUMBER
    if isinstance(dtype, T.StringType):
        return STRING
    return OTHER


def _type_name(schema: Any, name: str, element: bool = False) -> str:
    """Spark's name of column `name`'s type (of its elements with `element`)."""
    dtype = schema[name].dataType
    return (dtype.elementType if element else dtype).simpleString()


def _holds_exact_float32(schema: Any, name: str) -> bool:
    """True when every value column `name` can hold is exactly a float32: float, short,
    byte and boolean columns, or arrays of them (not a vector: its values are doubles)."""
    from pyspark.sql import types as T

    dtype = schema[name].dataType
    if isinstance(dtype, T.ArrayType):
        dtype = dtype.elementType
    return isinstance(dtype, T.FloatType | T.ShortType | T.ByteType | T.BooleanType)


def _features_array(schema: Any, names: Sequence[str], one_column: bool, element: str) -> Any:
    """A column expression giving the features as `array<element>` ("double" or "float"):
    the vector or array column `names[0]` with `one_column`, else the numeric columns
    `names` side by side. A vector needs `vector_to_array`, an array only a cast."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    if element not in ("double", "float"):
        raise ValueError(f"element must be 'double' or 'float', got {element!r}")
    if not one_column:
        return F.array(*[F.col(name).cast(element) for name in names])
    if column_kind(schema, names[0]) == VECTOR:
        return vector_to_array(F.col(names[0]), f"float{32 if element == 'float' else 64}")
    return F.col(names[0]).cast(f"array<{element}>")
