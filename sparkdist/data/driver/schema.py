"""Check a DataFrame's columns and shape them for training before Spark writes them.

Spark ML vectors become fixed-length float arrays and floating-point columns get one
precision (``dtype``), on the Spark side, so the readers only ever see plain Parquet
numbers, strings and lists of numbers. Anything else is refused up front, by column
name, before any Spark job, instead of failing later inside a rank. (Null values and
ragged arrays are found while the rows pass by once: `sparkdist.data.driver.writer`.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType

SUPPORTED_DTYPES = ("float32", "float64", None)


def check_dtype(dtype: str | None) -> None:
    """Refuse a float precision other than float32, float64 or None (keep as is)."""
    if dtype not in SUPPORTED_DTYPES:
        # petastorm's message, its spaces included (code written for it matches on it).
        raise ValueError(
            f"dtype {dtype} is not supported. {' ' * 12}Use 'float32' or float64 "
            "(or None: floats as they are)"
        )


def is_vector(data_type: DataType) -> bool:
    """A Spark ML (or MLlib) vector column."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.mllib.linalg import VectorUDT as OldVectorUDT

    return isinstance(data_type, VectorUDT | OldVectorUDT)


def _numeric_types() -> tuple[type, ...]:
    """Numbers and booleans: what the readers deliver as numpy numbers, also in arrays."""
    from pyspark.sql import types as T

    integers = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
    return (T.BooleanType, *integers, T.FloatType, T.DoubleType)


def _is_plain(data_type: DataType) -> bool:
    """Numbers, booleans, strings and bytes: what every reader turns into arrays directly."""
    from pyspark.sql import types as T

    return isinstance(data_type, (*_numeric_types(), T.StringType, T.BinaryType))


def _is_numeric_array(data_type: DataType) -> bool:
    from pyspark.sql import types as T

    return isinstance(data_type, T.ArrayType) and isinstance(
        data_type.elementType, _numeric_types()
    )


def unsupported_columns(df: DataFrame) -> list[str]:
    """Columns the readers cannot deliver, as 'name (type)'."""
    bad = []
    for field in df.schema.fields:
        data_type = field.dataType
        if not (_is_plain(data_type) or _is_numeric_array(data_type) or is_vector(data_type)):
            bad.append(f"{field.name} ({data_type.simpleString()})")
    return bad


class Prepared(NamedTuple):
    """A DataFrame as it will be written (``frame``), and which of the original's columns
    were Spark ML vectors (``vectors``: structs in Parquet, so not read in place)."""

    frame: DataFrame
    vectors: tuple[str, ...]


def prepare_dataframe(df: DataFrame, dtype: str | None) -> Prepared:
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
    columns, vectors = [], []
    for field in df.schema.fields:
        column = F.col(f"`{field.name}`")
        data_type = field.dataType
        if is_vector(data_type):
            column = vector_to_array(column, dtype or "float64")
            vectors.append(field.name)
        elif target is not None and isinstance(data_type, T.FloatType | T.DoubleType):
            column = column.cast(target)
        elif (
            target is not None
            and isinstance(data_type, T.ArrayType)
            and isinstance(data_type.elementType, T.FloatType | T.DoubleType)
        ):
            column = column.cast(T.ArrayType(target, data_type.containsNull))
        columns.append(column.alias(field.name))
    return Prepared(df.select(*columns), tuple(vectors))
