"""Is a DataFrame a plain scan of Parquet (or Delta) files, and of which?

Both consumers of a DataFrame's rows can skip Spark when its rows are exactly a file
source's, optionally with some columns selected: the partition ensembles read the files in
their source tasks, the converter hands them to the ranks instead of writing a copy.
Recognising that needs the query plan: the JVM's optimized plan in a classic session, the
client's own plan under Spark Connect (both pyspark internals, hence this module's place
in the Spark layer). Anything else (a
filter, a join, a computed or renamed column, a cached DataFrame, a stream) is not a plain
scan.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

FORMATS = ("parquet", "delta")


class NotPlainScan(Exception):
    """The DataFrame is not a plain file scan; the message says why (for a log line)."""


@dataclass(frozen=True)
class FileScan:
    """What a plain scan reads: Parquet files or a Delta table, by their roots."""

    format: str  # "parquet" or "delta"
    roots: tuple[str, ...]  # the paths given to the reader (for Delta: the table's root)
    partition_columns: frozenset[str]  # values from directory names, not from the files
    options: tuple[tuple[str, str], ...] = ()  # reader options (Connect only)


def plain_file_scan(df: Any, columns: Collection[str]) -> FileScan:
    """The scan whose rows `df` holds, when `columns` come straight from its files.

    Raises NotPlainScan (saying why) otherwise. Partition columns are reported, not
    refused: whether a caller can use them is its own question.
    """
    if hasattr(df, "_jdf"):
        return _classic_scan(df._jdf.queryExecution().optimizedPlan(), set(columns))
    plan = getattr(df, "_plan", None)
    if plan is not None:
        return _connect_scan(plan, set(columns))
    raise NotPlainScan(f"a {type(df).__name__} has no plan to inspect")


def _classic_scan(plan: Any, columns: set[str]) -> FileScan:
    while _class_name(plan) == "Project":
        projections = plan.projectList()
        for i in range(projections.size()):
            item = projections.apply(i)
            if item.name() in columns and _class_name(item) != "AttributeReference":
                raise NotPlainScan(f"column '{item.name()}' is computed, not read from a file")
        plan = plan.child()
    if _class_name(plan) != "LogicalRelation":
        raise NotPlainScan(
            f"the DataFrame is not a plain file scan (its plan has {plan.nodeName()})"
        )
    relation = plan.relation()
    if _class_name(relation) != "HadoopFsRelation":
        raise NotPlainScan(f"the source is a {_class_name(relation)}, not files")
    file_format = _class_name(relation.fileFormat())
    if file_format == "ParquetFileFormat":
        kind = "parquet"
        roots = relation.location().rootPaths()
        roots = tuple(roots.apply(i).toString() for i in range(roots.size()))
    elif file_format == "DeltaParquetFileFormat":
        # delta-spark's TahoeFileIndex: one table, at `path`.
        kind, roots = "delta", (relation.location().path().toString(),)
    else:
        raise NotPlainScan(f"the files are {relation.fileFormat().toString()}, not Parquet")
    partition_columns = frozenset(relation.partitionSchema().fieldNames())
    return FileScan(kind, roots, partition_columns)


def _connect_scan(plan: Any, columns: set[str]) -> FileScan:
    from pyspark.sql.connect.expressions import ColumnReference
    from pyspark.sql.connect.plan import DataSource, Project

    while isinstance(plan, Project):
        for column in plan._columns:
            if not isinstance(column._expr, ColumnReference):
                raise NotPlainScan(f"the DataFrame computes a column ({column})")
        plan = plan._child
    if not isinstance(plan, DataSource):
        raise NotPlainScan(
            f"the DataFrame is not a plain file scan (its plan has {type(plan).__name__})"
        )
    kind = (plan._format or "").lower()
    if kind not in FORMATS:
        raise NotPlainScan(f"the source's format is {plan._format!r}, not parquet or delta")
    if plan._predicates or plan._is_streaming:
        raise NotPlainScan("the source has predicates or is a stream")
    options = tuple(sorted((str(k), str(v)) for k, v in (plan._options or {}).items()))
    # Connect cannot tell the partition columns without asking the server; callers that
    # read the files check every column against the files' own schemas.
    return FileScan(kind, tuple(plan._paths or ()), frozenset(), options)


def _class_name(java_object: Any) -> str:
    return java_object.getClass().getSimpleName()
