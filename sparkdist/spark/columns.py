"""The columns of a user's DataFrame, as the ensemble reads and writes them: what type a
column holds, the features as one array column, and predictions added by a pandas UDF.

Spark's types, column functions and Spark ML's vector type live here, so the ensemble
reasons about kinds of column ("vector", "array", "number", "string") without importing
pyspark. pyspark is imported on first use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

VECTOR, ARRAY, NUMBER, STRING, OTHER = "vector", "array", "number", "string", "other"


def kind(schema: Any, name: str) -> str:
    """What column `name` of `schema` holds: VECTOR (Spark ML), ARRAY, NUMBER (numeric or
    boolean), STRING or OTHER."""
    return _kind(schema[name].dataType)


def element_kind(schema: Any, name: str) -> str:
    """What the elements of array column `name` are (see `kind`)."""
    return _kind(schema[name].dataType.elementType)


def type_name(schema: Any, name: str, element: bool = False) -> str:
    """Spark's name of column `name`'s type (of its elements with `element`)."""
    dtype = schema[name].dataType
    return (dtype.elementType if element else dtype).simpleString()


def holds_exact_float32(schema: Any, name: str) -> bool:
    """True when every value column `name` can hold is exactly a float32: float, short,
    byte and boolean columns, or arrays of them (not a vector: its values are doubles)."""
    from pyspark.sql import types as T

    dtype = schema[name].dataType
    if isinstance(dtype, T.ArrayType):
        dtype = dtype.elementType
    return isinstance(dtype, T.FloatType | T.ShortType | T.ByteType | T.BooleanType)


def features_array(schema: Any, names: Sequence[str], one_column: bool, element: str) -> Any:
    """A column expression giving the features as `array<element>` ("double" or "float"):
    the vector or array column `names[0]` with `one_column`, else the numeric columns
    `names` side by side. A vector needs `vector_to_array`, an array only a cast."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    if element not in ("double", "float"):
        raise ValueError(f"element must be 'double' or 'float', got {element!r}")
    if not one_column:
        return F.array(*[F.col(name).cast(element) for name in names])
    if kind(schema, names[0]) == VECTOR:
        return vector_to_array(F.col(names[0]), f"float{32 if element == 'float' else 64}")
    return F.col(names[0]).cast(f"array<{element}>")


def features_and_label(df: Any, features: Any, label_col: str, label_is_numeric: bool) -> Any:
    """`df` as two columns: the `features` expression, and the label (as a double when
    numeric)."""
    from pyspark.sql import functions as F

    label = F.col(label_col).cast("double") if label_is_numeric else F.col(label_col)
    return df.select(features, label)


def with_regression(df: Any, features: Any, predict: Callable, prediction_col: str) -> Any:
    """`df` plus `prediction_col`, a double that the iterator pandas UDF `predict` gives
    for the `features` expression."""
    from pyspark.sql.functions import pandas_udf

    return df.withColumn(prediction_col, pandas_udf(predict, "double")(features))


def with_classification(
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
