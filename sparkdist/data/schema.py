"""Check a DataFrame's columns and shape them for training before Spark writes them.

Spark ML vectors become fixed-length float arrays and floating-point columns get one
precision (``dtype``), on the Spark side, so the readers only ever see plain Parquet
numbers, strings and lists of numbers. Anything else is refused up front, by column
name, instead of failing later inside a rank: unsupported types before any Spark job,
null values and ragged arrays from aggregates computed while the rows pass by once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

SUPPORTED_DTYPES = ("float32", "float64", None)


def check_dtype(dtype: str | None) -> None:
    """Refuse a float precision other than float32, float64 or None (keep as is)."""
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype must be 'float32', 'float64' or None (keep as is), not {dtype!r}")


def is_vector(data_type: DataType) -> bool:
    """A Spark ML (or MLlib) vector column."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.mllib.linalg import VectorUDT as OldVectorUDT

    return isinstance(data_type, VectorUDT | OldVectorUDT)


def _is_plain(data_type: DataType) -> bool:
    """Numbers, booleans, strings and bytes: what every reader turns into arrays directly."""
    from pyspark.sql import types as T

    plain = (
        T.BooleanType,
        T.ByteType,
        T.ShortType,
        T.IntegerType,
        T.LongType,
        T.FloatType,
        T.DoubleType,
        T.StringType,
        T.BinaryType,
    )
    return isinstance(data_type, plain)


def _is_numeric_array(data_type: DataType) -> bool:
    from pyspark.sql import types as T

    numeric = (
        T.BooleanType,
        T.ByteType,
        T.ShortType,
        T.IntegerType,
        T.LongType,
        T.FloatType,
        T.DoubleType,
    )
    return isinstance(data_type, T.ArrayType) and isinstance(data_type.elementType, numeric)


def unsupported_columns(df: DataFrame) -> list[str]:
    """Columns the readers cannot deliver, as 'name (type)'."""
    bad = []
    for field in df.schema.fields:
        data_type = field.dataType
        if not (_is_plain(data_type) or _is_numeric_array(data_type) or is_vector(data_type)):
            bad.append(f"{field.name} ({data_type.simpleString()})")
    return bad


def prepare_dataframe(df: DataFrame, dtype: str | None) -> DataFrame:
    """The DataFrame as it will be written: vectors as arrays, floats in ``dtype``.

    Raises ValueError naming every column of an unsupported type, before any Spark job.
    """
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    check_dtype(dtype)
    names = [field.name for field in df.schema.fields]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"make_spark_converter needs unique column names; repeated: {duplicates}")
    bad = unsupported_columns(df)
    if bad:
        raise ValueError(
            "make_spark_converter cannot convert these columns: "
            + ", ".join(bad)
            + ". Supported: booleans, integers, floats, strings, binary, arrays of numbers and "
            "Spark ML vectors. Cast or drop the others first, e.g. "
            "df.withColumn('price', F.col('price').cast('double'))."
        )

    target = {"float32": T.FloatType(), "float64": T.DoubleType()}.get(dtype or "")
    columns = []
    for field in df.schema.fields:
        column = F.col(f"`{field.name}`")
        data_type = field.dataType
        if is_vector(data_type):
            column = vector_to_array(column, dtype or "float64")
        elif target is not None and isinstance(data_type, T.FloatType | T.DoubleType):
            column = column.cast(target)
        elif (
            target is not None
            and isinstance(data_type, T.ArrayType)
            and isinstance(data_type.elementType, T.FloatType | T.DoubleType)
        ):
            column = column.cast(T.ArrayType(target, data_type.containsNull))
        columns.append(column.alias(field.name))
    return df.select(*columns)


def value_checks(columns: Sequence[str], arrays: Sequence[str]) -> list[Column]:
    """Aggregates that find null values in `columns` and ragged or holed `arrays`.

    Computed while Spark writes the copy (an Observation), or in one pass over a source
    that is read in place; `check_values` turns the result into an error.
    """
    from pyspark.sql import functions as F

    checks = [F.count(F.lit(1)).alias("rows")]
    for i, name in enumerate(columns):
        checks.append(F.count_if(F.col(f"`{name}`").isNull()).alias(f"nulls{i}"))
    for i, name in enumerate(arrays):
        column = F.col(f"`{name}`")
        checks += [
            F.min(F.size(column)).alias(f"shortest{i}"),
            F.max(F.size(column)).alias(f"longest{i}"),
            F.count_if(F.exists(column, lambda value: value.isNull())).alias(f"holed{i}"),
        ]
    return checks


def check_values(metrics: dict, columns: Sequence[str], arrays: Sequence[str]) -> dict[str, int]:
    """Raise ValueError naming every column with nulls, ragged arrays or null elements.

    Returns each array column's length (what every row holds).
    """
    problems = []
    rows = metrics["rows"]
    for i, name in enumerate(columns):
        nulls = metrics[f"nulls{i}"]
        if nulls:
            problems.append(
                f"column '{name}' has {nulls} null values (of {rows} rows): fill or drop them, "
                f"e.g. df.na.fill(0, subset=['{name}']) or df.na.drop(subset=['{name}'])"
            )
    lengths = {}
    for i, name in enumerate(arrays):
        shortest, longest = metrics[f"shortest{i}"], metrics[f"longest{i}"]
        if shortest is not None and longest is not None and shortest != longest:
            problems.append(
                f"column '{name}' holds arrays of different lengths ({shortest} to {longest} "
                f"elements): only fixed-length arrays can be batched; pad or cut them to one "
                f"length n, e.g. F.slice(F.concat('{name}', F.array_repeat(F.lit(0.0), n)), 1, n)"
            )
        holed = metrics[f"holed{i}"]
        if holed:
            problems.append(
                f"column '{name}' has {holed} arrays with null elements: fill them, e.g. "
                f"F.transform('{name}', lambda v: F.coalesce(v, F.lit(0.0)))"
            )
        lengths[name] = max(longest or 0, 0)
    if problems:
        raise ValueError("make_spark_converter cannot batch this DataFrame: " + "; ".join(problems))
    return lengths
