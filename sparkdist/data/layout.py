"""What the driver learns about Parquet files: their footers, columns and the ranks' `Layout`.

Every Parquet footer sparkdist reads is read here, on the driver, once per file and 16 at a
time (`read_footers`): the files of a copy it has just written (`describe`), those of a
source the ranks read in place (`sparkdist.data.driver.sources`, which also checks here that each
file holds its columns with the kind of values Spark gives), and those the partition
ensembles read in their source tasks (`sparkdist.ensemble.fit.parquet_source`). A `Layout`
is what a rank needs of them: the files, the rows of each row group, the columns as the
readers deliver them (`ColumnInfo`). It pickles small and travels to the ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sparkdist.data import fs
from sparkdist.data.fs import NotReadable, locate


@dataclass(frozen=True)
class ColumnInfo:
    """One column as the readers deliver it.

    kind is "scalar" (numbers, bool), "array" (fixed-length numeric arrays, ``length``
    elements), "string" or "binary". dtype is the numpy dtype name of a value or element.
    ``shape`` is a row's shape when a transform makes arrays of more than one dimension.
    """

    name: str
    kind: str
    dtype: str
    length: int | None = None
    shape: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Layout:
    """What a rank needs to find its rows: files, rows per row group, columns. Picklable."""

    file_urls: tuple[str, ...]
    row_group_rows: tuple[tuple[int, ...], ...]
    columns: tuple[ColumnInfo, ...]
    row_bytes: int = 0  # average uncompressed bytes per row, to size read chunks

    @property
    def num_rows(self) -> int:
        return sum(sum(rows) for rows in self.row_group_rows)

    @property
    def num_row_groups(self) -> int:
        return sum(1 for rows in self.row_group_rows for n in rows if n)


@dataclass(frozen=True)
class Footer:
    """One file's footer, summed up. Column figures cover the columns it was read for."""

    url: str
    schema: pa.Schema
    row_group_rows: tuple[int, ...]
    row_group_bytes: tuple[int, ...]  # compressed, per row group
    uncompressed_bytes: int  # all columns, as the row groups declare it
    column_bytes: int  # uncompressed
    null_free: frozenset[str]  # columns whose statistics prove: no null anywhere
    file_bytes: int  # on disk

    @property
    def rows(self) -> int:
        return sum(self.row_group_rows)


def read_footers(
    urls: Sequence[str],
    columns: Sequence[str] | None = None,
    spark_schema: Any = None,
    located: Sequence[tuple[pafs.FileSystem, str]] | None = None,
) -> list[Footer]:
    """The footers of ``urls``, in their order (16 read at a time).

    Column figures are summed over ``columns`` (None: every column). With ``spark_schema``
    each file must hold ``columns`` with the kind of values Spark reads there. ``located``:
    the urls' file systems and paths (`fs.locate`), if the caller has them. Raises
    `NotReadable` for the first file, in order, that pyarrow cannot read or that fails.
    """
    if not urls:
        return []
    opened = located if located is not None else [locate(url) for url in urls]
    with ThreadPoolExecutor(max_workers=min(16, len(urls))) as pool:
        reads = [pool.submit(_read, filesystem, path) for filesystem, path in opened]
        footers = []
        for url, read in zip(urls, reads, strict=True):
            try:
                metadata, file_bytes = read.result()
            except (OSError, ValueError, pa.ArrowException) as error:
                raise NotReadable(f"pyarrow cannot read {url} ({error})") from error
            footer = _summary(url, metadata, columns, file_bytes)
            if spark_schema is not None:
                _check_kinds(footer, spark_schema, columns or [])
            footers.append(footer)
    return footers


def _read(filesystem: pafs.FileSystem, path: str) -> tuple[pq.FileMetaData, int]:
    with filesystem.open_input_file(path) as handle:
        return pq.ParquetFile(handle).metadata, handle.size()


def _summary(
    url: str, metadata: pq.FileMetaData, columns: Sequence[str] | None, file_bytes: int
) -> Footer:
    leaves: dict[str, list[int]] = {}  # leaf columns of the Parquet schema, by top-level name
    for i in range(metadata.num_columns):
        leaves.setdefault(metadata.schema.column(i).path.split(".")[0], []).append(i)
    names = list(leaves) if columns is None else list(columns)
    rows, sizes, uncompressed, column_bytes, proven = [], [], 0, 0, set(names)
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        rows.append(group.num_rows)
        uncompressed += group.total_byte_size
        compressed = 0
        for name in names:
            for leaf in leaves.get(name, []):
                chunk = group.column(leaf)
                compressed += chunk.total_compressed_size
                column_bytes += chunk.total_uncompressed_size
                stats = chunk.statistics
                if stats is None or not stats.has_null_count or stats.null_count:
                    proven.discard(name)
        sizes.append(compressed)
    schema = metadata.schema.to_arrow_schema()
    return Footer(
        url,
        schema,
        tuple(rows),
        tuple(sizes),
        uncompressed,
        column_bytes,
        frozenset(proven),
        file_bytes,
    )


def describe(dir_url: str) -> Layout:
    """The layout of the Parquet files Spark wrote under ``dir_url`` (a copy)."""
    file_urls = fs.list_parquet_files(dir_url)
    if not file_urls:
        raise FileNotFoundError(f"no Parquet files under {dir_url}")
    footers = read_footers(file_urls, columns=())
    row_group_rows = tuple(footer.row_group_rows for footer in footers)
    total_rows = sum(footer.rows for footer in footers)
    row_bytes = sum(footer.uncompressed_bytes for footer in footers) // max(total_rows, 1)
    columns = [_arrow_column(field) for field in footers[0].schema]
    lengths = _array_lengths(footers, [c.name for c in columns if c.kind == "array"])
    columns = [
        ColumnInfo(c.name, c.kind, c.dtype, lengths.get(c.name)) if c.kind == "array" else c
        for c in columns
    ]
    return Layout(tuple(file_urls), row_group_rows, tuple(columns), row_bytes)


def _arrow_column(field: pa.Field) -> ColumnInfo:
    data_type = field.type
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        element = np.dtype(data_type.value_type.to_pandas_dtype()).name
        return ColumnInfo(field.name, "array", element)
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return ColumnInfo(field.name, "string", "object")
    if pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type):
        return ColumnInfo(field.name, "binary", "object")
    return ColumnInfo(field.name, "scalar", np.dtype(data_type.to_pandas_dtype()).name)


def _array_lengths(footers: list[Footer], names: list[str]) -> dict[str, int]:
    """Each array column's length, from the first row of the data (a copy is checked)."""
    if not names:
        return {}
    for footer in footers:
        non_empty = [i for i, n in enumerate(footer.row_group_rows) if n]
        if non_empty:
            parquet = fs.open_parquet(footer.url)
            first = next(parquet.iter_batches(1, row_groups=non_empty[:1], columns=names))
            lengths = {}
            for name in names:
                value = first.column(name)[0].values
                lengths[name] = 0 if value is None else len(value)
            return lengths
    return {}


# -- a source read in place: its files against Spark's schema -------------------------------


def _check_kinds(footer: Footer, spark_schema: Any, columns: Sequence[str]) -> None:
    for name in columns:
        if footer.schema.get_field_index(name) < 0:
            raise NotReadable(
                f"column '{name}' is not in {footer.url} (or not under that exact name)"
            )
        have = _kind(footer.schema.field(name).type)
        if have != _spark_kind(spark_schema[name].dataType):
            raise NotReadable(
                f"column '{name}' is {footer.schema.field(name).type} in {footer.url}"
            )


def _kind(data_type: pa.DataType) -> str:
    """The kind of values a Parquet column holds, as far as the readers care."""
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return "array of " + _kind(data_type.value_type)
    if pa.types.is_boolean(data_type):
        return "boolean"
    if pa.types.is_integer(data_type):
        return "integer"
    if pa.types.is_floating(data_type):
        return "float"
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return "string"
    if pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type):
        return "binary"
    return str(data_type)


def _spark_kind(data_type: Any) -> str:
    from pyspark.sql import types as T

    if isinstance(data_type, T.ArrayType):
        return "array of " + _spark_kind(data_type.elementType)
    kinds = [
        (T.BooleanType, "boolean"),
        (T.ByteType | T.ShortType | T.IntegerType | T.LongType, "integer"),
        (T.FloatType | T.DoubleType, "float"),
        (T.StringType, "string"),
        (T.BinaryType, "binary"),
    ]
    for types, kind in kinds:
        if isinstance(data_type, types):
            return kind
    return data_type.simpleString()


_NUMPY = {
    "BooleanType": "bool",
    "ByteType": "int8",
    "ShortType": "int16",
    "IntegerType": "int32",
    "LongType": "int64",
    "FloatType": "float32",
    "DoubleType": "float64",
}


def spark_layout(
    footers: list[Footer], fields: Sequence[Any], dtype: str | None, lengths: Mapping[str, int]
) -> Layout:
    """The layout of a source read in place: its files, and Spark's ``fields`` as a copy
    of them would deliver them (floats in ``dtype``, arrays of ``lengths``)."""
    rows = sum(footer.rows for footer in footers)
    return Layout(
        file_urls=tuple(footer.url for footer in footers),
        row_group_rows=tuple(footer.row_group_rows for footer in footers),
        columns=tuple(_spark_column(field, dtype, lengths) for field in fields),
        row_bytes=sum(footer.column_bytes for footer in footers) // max(1, rows),
    )


def _spark_column(field: Any, dtype: str | None, lengths: Mapping[str, int]) -> ColumnInfo:
    """What a rank delivers for Spark's `field`: its type, floats in `dtype`."""
    from pyspark.sql import types as T

    data_type = field.dataType
    if isinstance(data_type, T.StringType):
        return ColumnInfo(field.name, "string", "object")
    if isinstance(data_type, T.BinaryType):
        return ColumnInfo(field.name, "binary", "object")
    is_array = isinstance(data_type, T.ArrayType)
    value_type = data_type.elementType if is_array else data_type
    numpy_dtype = _NUMPY[type(value_type).__name__]
    if dtype is not None and isinstance(value_type, T.FloatType | T.DoubleType):
        numpy_dtype = np.dtype(dtype).name
    if is_array:
        return ColumnInfo(field.name, "array", numpy_dtype, lengths.get(field.name))
    return ColumnInfo(field.name, "scalar", numpy_dtype)
