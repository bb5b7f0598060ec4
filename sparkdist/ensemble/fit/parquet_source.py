"""Read a plain Parquet scan's files with pyarrow in the source tasks.

Spark hands rows to Python through its JVM Parquet reader, a row projection and its Arrow
writer: for 1e6 rows x 50 doubles that costs about 8 CPU seconds (4 s on 2 cores), while
pyarrow decodes the same file in 0.3 s on one core. When the DataFrame given to `fit` is
exactly a Parquet scan (optionally with some columns selected), the tasks that spread the
rows read its files directly instead, row group by row group, and hand the same (features,
labels) to the spread. Anything else (a filter, a join, a computed column, a cached or
partitioned-by-column source, a store pyarrow cannot open) goes through Spark as before.

Recognizing a plain scan is `sparkdist.spark.file_scan`'s job (shared with the converter).
Every file's footer is read on the driver first (`sparkdist.data.layout`, the converter's
footer reader), so a file that lacks a column, or holds it with another type, keeps the
Spark path instead of failing in a task.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sparkdist.data.fs import filesystem_and_path
from sparkdist.data.layout import NotReadable, locate, read_footers
from sparkdist.ensemble.model.features import FeatureSpec
from sparkdist.spark.file_scan import NotPlainScan, plain_file_scan

logger = logging.getLogger(__name__)

# Footers are read on the driver; beyond this many files Spark reads.
MAX_FILES = 4096
# Splits smaller than this cost more in task overhead than they gain in balance.
_OPEN_COST_BYTES = 4 * 2**20


@dataclass(frozen=True)
class ParquetSplit:
    """What one source task reads: row groups of one or more files, as (url, indexes),
    from row `skip` of the first row group on, `rows` rows in all (None: every row)."""

    parts: tuple[tuple[str, tuple[int, ...]], ...]
    skip: int = 0
    rows: int | None = None


@dataclass(frozen=True)
class ParquetSource:
    """The files of a plain Parquet scan, cut into splits; shipped in the task closure."""

    splits: tuple[ParquetSplit, ...]
    feature_columns: tuple[str, ...]  # plain numeric columns, or one list column
    features_are_lists: bool
    label_column: str
    label_is_numeric: bool

    def rows(self, split: int) -> int:
        """The rows split number `split` holds (splits cut by row counts only)."""
        rows = self.splits[split].rows
        if rows is None:
            raise ValueError("the splits were cut by size; their row counts are unknown")
        return rows


def find_parquet_source(
    df: Any,
    spec: FeatureSpec,
    label_col: str,
    label_is_numeric: bool,
    slots: int | None,
    parts: int | None = None,
) -> ParquetSource | None:
    """The files to read for `df`'s feature and label columns, or None when Spark must
    read them (why is logged). Cut into splits by size for `slots` task slots (None:
    unknown), or into exactly `parts` splits of equal row counts."""
    columns = [*spec.input_columns, label_col]
    reason = _plain_scan_refusal(df, columns)
    if reason is None:
        urls = sorted(df.inputFiles())
        reason, groups = _row_groups(urls, spec, label_col, label_is_numeric)
    if reason is not None:
        logger.info("Spark reads the rows: %s", reason)
        return None
    if parts is None:
        total = sum(g[2] for g in groups)
        splits = tuple(_pack(groups, _split_bytes(df.sparkSession, total, slots)))
    else:
        splits = tuple(_row_ranges(groups, parts))
    source = ParquetSource(
        splits=splits,
        feature_columns=tuple(spec.input_columns),
        features_are_lists=spec.features_col is not None,
        label_column=label_col,
        label_is_numeric=label_is_numeric,
    )
    logger.info(
        "reading %d Parquet row groups of %d files directly, in %d splits",
        len(groups),
        len(urls),
        len(source.splits),
    )
    return source


def read_split(
    source: ParquetSource,
    split: ParquetSplit,
    dtype: Any,
    max_rows: int,
    keep: np.ndarray | None = None,
) -> Iterator[tuple[pa.Array, np.ndarray | pa.Array]]:
    """A split's rows as (features, labels) pieces of at most `max_rows` rows: features a
    float matrix for plain columns, or the list column itself (the caller checks it).

    With `keep` (a mask over the split's rows), a plain columns' matrix holds only the
    kept rows of its piece (the labels all of them): a reader that keeps a few of the rows
    never holds a row group's matrix.
    """
    skip = split.skip
    left = math.inf if split.rows is None else split.rows
    done = 0  # the split's rows read so far
    for url, row_groups in split.parts:
        filesystem, path = filesystem_and_path(url)
        with filesystem.open_input_file(path) as handle:
            parquet = pq.ParquetFile(handle)
            for row_group in row_groups:
                n_rows = parquet.metadata.row_group(row_group).num_rows
                rows = slice(skip, skip + int(min(left, n_rows - skip)))
                skip, left = 0, left - (rows.stop - rows.start)
                labels = _read(parquet, row_group, [source.label_column], rows).column(0)
                labels = labels.combine_chunks().cast(
                    pa.float64() if source.label_is_numeric else pa.string()
                )
                kept = None
                if keep is not None and not source.features_are_lists:
                    kept = np.flatnonzero(keep[done : done + len(labels)])
                done += len(labels)
                features = _read_features(source, parquet, row_group, rows, dtype, kept)
                for start in range(0, len(labels), max_rows):
                    if kept is None:
                        piece = features[start : start + max_rows]
                    else:
                        piece = features[slice(*np.searchsorted(kept, [start, start + max_rows]))]
                    yield piece, labels.slice(start, max_rows)


# Plain feature columns are decoded this many at a time. Reading half of a 1e6 x 50
# float64 file in 20 MB row groups grew the reader's memory by 146 MB decoding all
# columns at once, 95 MB 16 at a time, 42 MB 4 at a time, in the same 0.2-0.3 s.
_COLUMNS_AT_ONCE = 4


def _read(parquet: pq.ParquetFile, row_group: int, columns: list[str], rows: slice) -> pa.Table:
    table = parquet.read_row_group(row_group, columns=columns, use_threads=False)
    if rows.start or rows.stop < table.num_rows:
        table = table.slice(rows.start, rows.stop - rows.start)
    return table


def _read_features(
    source: ParquetSource,
    parquet: pq.ParquetFile,
    row_group: int,
    rows: slice,
    dtype: Any,
    kept: np.ndarray | None = None,
) -> np.ndarray | pa.Array:
    """A row group's features: the list column, or the plain columns as one matrix (of
    the `kept` rows only, where given)."""
    names = list(source.feature_columns)
    if source.features_are_lists:
        return _read(parquet, row_group, names, rows).column(0).combine_chunks()
    # Filled column by column in the transposed layout (contiguous writes), then one
    # transposing copy: 3 times faster than writing strided columns into a row-major matrix.
    n_rows = rows.stop - rows.start if kept is None else len(kept)
    columns = np.empty((len(names), n_rows), dtype=dtype)
    for first in range(0, len(names), _COLUMNS_AT_ONCE):
        table = _read(parquet, row_group, names[first : first + _COLUMNS_AT_ONCE], rows)
        for i, column in enumerate(table.columns):
            values = column.to_numpy()
            columns[first + i] = values if kept is None else values[kept]
        del table
    return np.ascontiguousarray(columns.T)


def _plain_scan_refusal(df: Any, columns: list[str]) -> str | None:
    """None when `df`'s rows are exactly those of a Parquet scan and `columns` come
    straight from its files; otherwise why not."""
    try:
        scan = plain_file_scan(df, columns)
    except NotPlainScan as why:
        return str(why)
    if scan.format != "parquet":
        return f"the source is a {scan.format} table, not Parquet files"
    if scan.partition_columns & set(columns):
        return f"columns {sorted(scan.partition_columns & set(columns))} come from directory names"
    return None


def _row_groups(
    urls: list[str], spec: FeatureSpec, label_col: str, label_is_numeric: bool
) -> tuple[str | None, list[tuple[str, int, int, int]]]:
    """(refusal, [(url, row group, bytes, rows)]) after checking every file's columns."""
    if not urls:
        return "the scan lists no files", []
    if len(urls) > MAX_FILES:
        return f"the scan has {len(urls)} files (more than {MAX_FILES})", []
    try:
        for url in urls:
            if type(locate(url)[0]).__name__ != "LocalFileSystem":
                return f"{url} is not on a local or mounted file system", []
        footers = read_footers(urls)
    except NotReadable as why:
        return str(why), []
    groups = []
    for footer in footers:
        reason = _schema_refusal(footer.schema, spec, label_col, label_is_numeric)
        if reason is not None:
            return f"{footer.url}: {reason}", []
        for i, (rows, size) in enumerate(
            zip(footer.row_group_rows, footer.row_group_bytes, strict=True)
        ):
            if rows:
                groups.append((footer.url, i, size, rows))
    return None, groups


def _schema_refusal(
    schema: pa.Schema, spec: FeatureSpec, label_col: str, label_is_numeric: bool
) -> str | None:
    for name in [*spec.input_columns, label_col]:
        if schema.get_field_index(name) < 0:
            return f"column '{name}' is not in the file (or not under that exact name)"
    for name in spec.input_columns:
        dtype = schema.field(name).type
        if spec.features_col is not None:
            if not (pa.types.is_list(dtype) or pa.types.is_large_list(dtype)):
                return f"feature column '{name}' is {dtype}, read as a Spark vector"
            dtype = dtype.value_type
        if not _is_plain_number(dtype):
            return f"feature column '{name}' is {dtype}"
    label = schema.field(label_col).type
    if label_is_numeric and not _is_plain_number(label):
        return f"label column '{label_col}' is {label}"
    if not label_is_numeric and not (pa.types.is_string(label) or pa.types.is_large_string(label)):
        return f"label column '{label_col}' is {label}"
    return None


def _is_plain_number(dtype: pa.DataType) -> bool:
    return pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_boolean(dtype)


# A split aims at the data spread evenly over the task slots. Fewer, larger splits than
# Spark's reader makes: a Python task costs about 0.1 s of a slot on its own (measured: 20
# empty mapInArrow tasks take 1.6 s on 2 slots, 2 take 0.2 s), and a split is read row
# group by row group, so its size does not add memory.


def _split_bytes(spark: Any, total_bytes: int, slots: int | None) -> int:
    """The bytes each split aims at: the data spread evenly over the task slots, at least
    the cost of opening one (Spark's spark.sql.files.maxPartitionBytes where the slots are
    unknown)."""
    if slots is None:
        return parse_bytes(spark.conf.get("spark.sql.files.maxPartitionBytes", None) or "128m")
    return max(_OPEN_COST_BYTES, math.ceil(total_bytes / max(1, slots)))


def parse_bytes(value: str) -> int:
    """A Spark size setting ("16m", "134217728", "1g") in bytes."""
    units = {"k": 2**10, "m": 2**20, "g": 2**30}
    text = value.strip().lower().removesuffix("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def _pack(groups: list[tuple[str, int, int, int]], split_bytes: int) -> Iterator[ParquetSplit]:
    """Row groups in file order, a split closed once it holds `split_bytes`."""
    parts: dict[str, list[int]] = {}
    size = 0
    for url, index, group_size, _ in groups:
        parts.setdefault(url, []).append(index)
        size += group_size
        if size >= split_bytes:
            yield ParquetSplit(tuple((u, tuple(rgs)) for u, rgs in parts.items()))
            parts, size = {}, 0
    if parts:
        yield ParquetSplit(tuple((u, tuple(rgs)) for u, rgs in parts.items()))


def _row_ranges(groups: list[tuple[str, int, int, int]], n: int) -> Iterator[ParquetSplit]:
    """The rows in file order cut into `n` splits of equal counts (to one row): split i
    holds rows [i * total // n, (i + 1) * total // n), row groups cut where needed."""
    total = sum(rows for *_, rows in groups)
    first = 0  # the first row of groups[g] among all rows
    g = 0
    for i in range(n):
        start, stop = i * total // n, (i + 1) * total // n
        while g < len(groups) and first + groups[g][3] <= start:
            first += groups[g][3]
            g += 1
        skip, parts = start - first, {}
        end, j = first, g
        while j < len(groups) and end < stop:
            parts.setdefault(groups[j][0], []).append(groups[j][1])
            end += groups[j][3]
            j += 1
        yield ParquetSplit(
            tuple((url, tuple(indexes)) for url, indexes in parts.items()), skip, stop - start
        )
