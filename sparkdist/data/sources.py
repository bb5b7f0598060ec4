"""A DataFrame that is a plain Parquet or Delta scan, read by the ranks where it lies.

When `sparkdist.spark.file_scan` finds that a DataFrame's rows are exactly a file source's
(optionally with some of its columns selected), copying it would only spend time and
disk: the ranks can read the source's own files. This module decides whether they can,
file by file (every footer is read here, on the driver), and builds the `Layout` they
read. It says no, and the DataFrame is copied as before, when a column would not come out
of the files as Spark gives it: a Spark ML vector (a struct in Parquet), a partition
column (a directory name), a column missing from a file or held with another kind of type,
a Delta table with deletion vectors or column mapping, a store pyarrow cannot open. The
reason is logged at INFO.

Null values and ragged arrays are found as for a copy, at conversion: from the footers'
statistics where they prove there are none, else by one Spark aggregation over the
columns that need it (the array columns always: their lengths are not in the footers).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sparkdist.data import delta_log, fs
from sparkdist.data.columns import ColumnInfo
from sparkdist.data.reader import Layout
from sparkdist.data.schema import check_values, is_vector, value_checks
from sparkdist.spark.file_scan import FileScan, NotPlainScan, plain_file_scan

logger = logging.getLogger(__name__)

# Footers are read on the driver (16 at a time); a source with more files is copied,
# which also compacts it.
MAX_FILES = 20_000
_TIME_TRAVEL = {"versionasof", "timestampasof", "startingversion", "startingtimestamp"}


class NotReadable(Exception):
    """The ranks cannot read the source's files as they are; the message says why."""


@dataclass(frozen=True)
class DirectSource:
    """A source the ranks read in place: its kind ("parquet"/"delta") and its layout."""

    kind: str
    layout: Layout
    file_bytes: int  # on disk, all columns of the files


def find_direct_source(df: Any, dtype: str | None) -> DirectSource | None:
    """The layout of `df`'s source files when ranks can read them as they are, else None
    (the reason is logged). Raises ValueError for null values or ragged arrays."""
    columns = list(df.columns)
    try:
        scan = plain_file_scan(df, columns)
        urls = _source_files(df, scan)
        _check_columns(df, scan, columns)
        footers = _read_footers(urls, df.schema, columns)
    except (NotPlainScan, NotReadable) as why:
        logger.info("sparkdist.data: the DataFrame is copied: %s", why)
        return None
    lengths = _check_values(df, columns, footers)
    layout = Layout(
        file_urls=tuple(urls),
        row_group_rows=tuple(footer.row_group_rows for footer in footers),
        columns=tuple(_column_info(df.schema[name], dtype, lengths) for name in columns),
        row_bytes=sum(f.column_bytes for f in footers) // max(1, sum(f.rows for f in footers)),
    )
    return DirectSource(scan.format, layout, sum(footer.file_bytes for footer in footers))


def _source_files(df: Any, scan: FileScan) -> list[str]:
    if scan.format == "delta":
        urls = _delta_files(df, scan)
    else:
        urls = sorted(df.inputFiles())
        deltas = [root for root in scan.roots if _is_delta(root)]
        if deltas:
            logger.warning(
                "sparkdist.data: %s is a Delta table read as plain Parquet: its rows include "
                "files the table has removed; read it with spark.read.format('delta')",
                deltas[0],
            )
    if not urls:
        raise NotReadable("the scan lists no files")
    if len(urls) > MAX_FILES:
        raise NotReadable(f"the source has {len(urls)} files (more than {MAX_FILES})")
    return urls


def _is_delta(root: str) -> bool:
    try:
        return delta_log.is_delta_table(fs.normalize_dir_url(root))
    except (OSError, ValueError, pa.ArrowException):
        return False


def _delta_files(df: Any, scan: FileScan) -> list[str]:
    """The current snapshot's files, from the table's log, when plain Parquet reads them."""
    if len(scan.roots) != 1:
        raise NotReadable(f"the Delta scan has {len(scan.roots)} roots")
    travel = sorted(key for key, _ in scan.options if key.lower() in _TIME_TRAVEL)
    if travel:
        raise NotReadable(f"the Delta scan reads another version ({', '.join(travel)})")
    try:
        snapshot = delta_log.read_snapshot(fs.normalize_dir_url(scan.roots[0]))
    except (OSError, ValueError, KeyError, pa.ArrowException) as error:
        raise NotReadable(f"cannot read the Delta log of {scan.roots[0]} ({error})") from error
    reason = snapshot.refusal()
    if reason is not None:
        raise NotReadable(reason)
    partitioned = set(snapshot.partition_columns) & set(df.columns)
    if partitioned:
        raise NotReadable(f"columns {sorted(partitioned)} are Delta partition values")
    urls = list(snapshot.file_urls)
    # The plan's own file list, when Spark can give it, must be the snapshot we read.
    try:
        planned = {_local_key(url) for url in df.inputFiles()}
    except Exception:  # noqa: BLE001 - a client that cannot list files: the log decides
        planned = None
    if planned is not None and planned != {_local_key(url) for url in urls}:
        raise NotReadable(
            f"Spark's files for the scan differ from version {snapshot.version} of the log"
        )
    logger.info(
        "sparkdist.data: Delta table %s, version %d: %d files",
        scan.roots[0],
        snapshot.version,
        len(urls),
    )
    return urls


def _local_key(url: str) -> tuple[str, str]:
    filesystem, path = fs.filesystem_and_path(url)
    return type(filesystem).__name__, path


def _check_columns(df: Any, scan: FileScan, columns: list[str]) -> None:
    partitioned = scan.partition_columns & set(columns)
    if partitioned:
        raise NotReadable(f"columns {sorted(partitioned)} come from directory names")
    vectors = [f.name for f in df.schema.fields if is_vector(f.dataType)]
    if vectors:
        raise NotReadable(f"columns {vectors} are Spark ML vectors (structs in Parquet)")


@dataclass(frozen=True)
class _Footer:
    row_group_rows: tuple[int, ...]
    rows: int
    column_bytes: int  # uncompressed, the selected columns only
    file_bytes: int
    nulls_known_zero: frozenset[str]  # columns whose statistics say: no null anywhere


def _read_footers(urls: list[str], schema: Any, columns: list[str]) -> list[_Footer]:
    with ThreadPoolExecutor(max_workers=min(16, len(urls))) as pool:
        return list(pool.map(lambda url: _footer(url, schema, columns), urls))


def _footer(url: str, schema: Any, columns: list[str]) -> _Footer:
    try:
        filesystem, path = fs.filesystem_and_path(url)
        with filesystem.open_input_file(path) as handle:
            metadata = pq.ParquetFile(handle).metadata
            file_bytes = handle.size()
    except (OSError, ValueError, pa.ArrowException) as error:
        raise NotReadable(f"pyarrow cannot read {url} ({error})") from error
    arrow_schema = metadata.schema.to_arrow_schema()
    for name in columns:
        if arrow_schema.get_field_index(name) < 0:
            raise NotReadable(f"column '{name}' is not in {url} (or not under that exact name)")
        have, want = _kind(arrow_schema.field(name).type), _spark_kind(schema[name].dataType)
        if have != want:
            raise NotReadable(f"column '{name}' is {arrow_schema.field(name).type} in {url}")
    # Leaf columns of the Parquet schema, by their top-level name.
    leaves: dict[str, list[int]] = {}
    for i in range(metadata.num_columns):
        leaves.setdefault(metadata.schema.column(i).path.split(".")[0], []).append(i)
    rows, column_bytes, proven = [], 0, set(columns)
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        rows.append(group.num_rows)
        for name in columns:
            for leaf in leaves.get(name, []):
                chunk = group.column(leaf)
                column_bytes += chunk.total_uncompressed_size
                stats = chunk.statistics
                if stats is None or not stats.has_null_count or stats.null_count:
                    proven.discard(name)
    return _Footer(tuple(rows), sum(rows), column_bytes, file_bytes, frozenset(proven))


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


def _check_values(df: Any, columns: list[str], footers: list[_Footer]) -> dict[str, int]:
    """Nulls and array lengths: from statistics where they suffice, else one Spark pass."""
    from pyspark.sql import types as T

    proven = frozenset.intersection(*(footer.nulls_known_zero for footer in footers))
    arrays = [f.name for f in df.schema.fields if isinstance(f.dataType, T.ArrayType)]
    unproven = [name for name in columns if name not in proven]
    if not unproven and not arrays:
        return {}
    logger.info(
        "sparkdist.data: checking columns %s for null values and ragged arrays (one Spark pass)",
        sorted(set(unproven) | set(arrays)),
    )
    row = df.select(*[f"`{n}`" for n in dict.fromkeys(unproven + arrays)]).agg(
        *value_checks(unproven, arrays)
    )
    return check_values(row.first().asDict(), unproven, arrays)


_NUMPY = {
    "BooleanType": "bool",
    "ByteType": "int8",
    "ShortType": "int16",
    "IntegerType": "int32",
    "LongType": "int64",
    "FloatType": "float32",
    "DoubleType": "float64",
}


def _column_info(field: Any, dtype: str | None, lengths: dict[str, int]) -> ColumnInfo:
    """What a rank delivers for `field`: Spark's type, floats in `dtype` (as a copy has)."""
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
