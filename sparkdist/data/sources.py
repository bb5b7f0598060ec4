"""A DataFrame that is a plain Parquet or Delta scan, read by the ranks where it lies.

When `sparkdist.spark.file_scan` finds that a DataFrame's rows are exactly a file source's
(optionally with some of its columns selected), copying it would only spend time and
disk: the ranks can read the source's own files. This module decides whether they can
(every footer is read on the driver by `sparkdist.data.files`, which builds the `Layout`
they read). It says no, and the DataFrame is copied as before, when a column would not
come out of the files as Spark gives it: a Spark ML vector (a struct in Parquet), a
partition column (a directory name), a column missing from a file or held with another
kind of type, a Delta table with deletion vectors or column mapping, a store pyarrow
cannot open. The reason is logged at INFO.

Null values and ragged arrays are found as for a copy, at conversion: from the footers'
statistics where they prove there are none, else by one Spark aggregation over the
columns that need it (the array columns always: their lengths are not in the footers).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sparkdist.data import delta_log, fs
from sparkdist.data.files import Footer, Layout, NotReadable, read_footers, spark_layout
from sparkdist.data.schema import is_vector
from sparkdist.data.writer import check_values, value_checks
from sparkdist.spark.file_scan import FileScan, NotPlainScan, plain_file_scan

logger = logging.getLogger(__name__)

# Footers are read on the driver (16 at a time); a source with more files is copied,
# which also compacts it.
MAX_FILES = 20_000
_TIME_TRAVEL = {"versionasof", "timestampasof", "startingversion", "startingtimestamp"}


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
        footers = read_footers(urls, columns, df.schema)
    except (NotPlainScan, NotReadable) as why:
        logger.info("sparkdist.data: the DataFrame is copied: %s", why)
        return None
    lengths = _check_values(df, columns, footers)
    layout = spark_layout(footers, [df.schema[name] for name in columns], dtype, lengths)
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
        return delta_log.is_delta_table(root)
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
        snapshot = delta_log.read_snapshot(scan.roots[0])
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


def _check_values(df: Any, columns: list[str], footers: list[Footer]) -> dict[str, int]:
    """Nulls and array lengths: from statistics where they suffice, else one Spark pass."""
    from pyspark.sql import types as T

    proven = frozenset.intersection(*(footer.null_free for footer in footers))
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
