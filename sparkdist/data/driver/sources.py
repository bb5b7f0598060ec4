"""A DataFrame that is a plain Parquet or Delta scan, read by the ranks where it lies.

When `sparkdist.spark.file_scan` finds that a DataFrame's rows are exactly a file source's
(optionally with some of its columns selected), copying it would only spend time and
disk: the ranks can read the source's own files. This module decides whether they can
(every footer is read on the driver by `sparkdist.data.layout`, which builds the `Layout`
they read). It says no, and the DataFrame is copied as before, when a column would not
come out of the files as Spark gives it: a Spark ML vector (a struct in Parquet), a
partition column (a directory name), a column missing from a file or held with another
kind of type, a Delta table with deletion vectors or column mapping, a store pyarrow
cannot open. The reason is logged at INFO.

Null values and ragged arrays are found as for a copy, at conversion: from the footers'
statistics where they prove there are none, else by one Spark aggregation over the
columns that need it (the array columns always: their lengths are not in the footers).

A Delta table's current files are read from its transaction log with pyarrow (the second
half of this module). A Delta table is Parquet files plus `_delta_log/`: JSON commits
(`<version>.json`, one action per line: `add`, `remove`, `metaData`, `protocol`, ...)
and, every so often, a Parquet checkpoint holding the state up to its version
(`_last_checkpoint` names the newest). Replaying the newest checkpoint and the commits
after it gives the snapshot: the files whose rows the table holds now. Ranks can read
those files as they are unless the table needs more than Parquet to be read right, which
`Snapshot.refusal` names: deletion vectors (rows deleted outside the files), column
mapping (columns renamed in the log only), or a reader feature this replay does not
know.
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sparkdist.data import fs
from sparkdist.data.driver.writer import check_values, value_checks
from sparkdist.data.fs import NotReadable
from sparkdist.data.layout import Footer, Layout, read_footers, spark_layout
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


def find_direct_source(df: Any, dtype: str | None, vectors: Sequence[str]) -> DirectSource | None:
    """The layout of `df`'s source files when ranks can read them as they are, else None
    (the reason is logged; ``vectors``: `df`'s Spark ML vector columns, which Parquet holds
    as structs). Raises ValueError for null values or ragged arrays."""
    columns = list(df.columns)
    try:
        scan = plain_file_scan(df, columns)
        urls = _source_files(df, scan)
        located = [fs.locate(url) for url in urls]
        _check_columns(scan, columns, vectors)
        footers = read_footers(urls, columns, df.schema, located)
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
        return is_delta_table(root)
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
        snapshot = read_snapshot(scan.roots[0])
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


def _check_columns(scan: FileScan, columns: list[str], vectors: Sequence[str]) -> None:
    partitioned = scan.partition_columns & set(columns)
    if partitioned:
        raise NotReadable(f"columns {sorted(partitioned)} come from directory names")
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


# -- a Delta table's snapshot, from its transaction log --

# Reader features that do not change how a Parquet file's rows are read.
_HARMLESS_FEATURES = frozenset({"timestampNtz", "vacuumProtocolCheck", "v2Checkpoint"})
_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.\d+\.\d+)?\.parquet$")


@dataclass(frozen=True)
class Snapshot:
    """The table at `version`: its data files (URLs) and what reading them needs."""

    version: int
    file_urls: tuple[str, ...]
    partition_columns: tuple[str, ...]
    column_mapping: str  # "none", "name" or "id"
    reader_features: frozenset[str]
    has_deletion_vectors: bool

    def refusal(self) -> str | None:
        """Why reading the files as plain Parquet would not give the table's rows."""
        if self.has_deletion_vectors:
            return "the Delta table has deletion vectors (rows deleted outside its files)"
        if self.column_mapping != "none":
            return f"the Delta table maps its columns by {self.column_mapping}"
        unknown = self.reader_features - _HARMLESS_FEATURES - {"deletionVectors", "columnMapping"}
        if unknown:
            return f"the Delta table needs reader features {sorted(unknown)}"
        return None


def is_delta_table(table_url: str) -> bool:
    """True when `table_url` (a directory URL or path) holds a `_delta_log` directory."""
    filesystem, path = fs.filesystem_and_path(fs.normalize_dir_url(table_url))
    info = filesystem.get_file_info(posixpath.join(path, "_delta_log"))
    return info.type == pafs.FileType.Directory


def read_snapshot(table_url: str) -> Snapshot:
    """Replay `table_url`'s log: its newest checkpoint, then the commits after it."""
    table_url = fs.normalize_dir_url(table_url)
    filesystem, root = fs.filesystem_and_path(table_url)
    log_dir = posixpath.join(root, "_delta_log")
    names = [
        info.base_name
        for info in filesystem.get_file_info(pafs.FileSelector(log_dir))
        if info.type == pafs.FileType.File
    ]
    commits = sorted(int(m.group(1)) for m in map(_COMMIT.match, names) if m)
    checkpoints: dict[int, list[str]] = {}
    for name in names:
        match = _CHECKPOINT.match(name)
        if match:
            checkpoints.setdefault(int(match.group(1)), []).append(name)
    if not commits and not checkpoints:
        raise FileNotFoundError(f"{table_url} has no Delta commits under _delta_log/")
    state = _State()
    start = -1
    if checkpoints:
        start = max(checkpoints)
        for name in sorted(checkpoints[start]):
            table = pq.read_table(
                filesystem.open_input_file(posixpath.join(log_dir, name)),
                columns=["add", "remove", "metaData", "protocol"],
            )
            for row in table.to_pylist():
                state.apply({k: v for k, v in row.items() if v is not None})
    for version in commits:
        if version <= start:
            continue
        with filesystem.open_input_stream(posixpath.join(log_dir, f"{version:020d}.json")) as f:
            for line in f.read().decode("utf-8").splitlines():
                if line.strip():
                    state.apply(json.loads(line))
    version = max([start, *commits])
    return state.snapshot(table_url, version)


class _State:
    """The log replayed so far: live files by path, the newest metaData and protocol."""

    def __init__(self) -> None:
        self.files: dict[str, dict[str, Any]] = {}
        self.metadata: dict[str, Any] = {}
        self.protocol: dict[str, Any] = {}

    def apply(self, action: dict[str, Any]) -> None:
        if "add" in action:
            self.files[action["add"]["path"]] = action["add"]
        if "remove" in action:
            self.files.pop(action["remove"]["path"], None)
        if "metaData" in action:
            self.metadata = action["metaData"]
        if "protocol" in action:
            self.protocol = action["protocol"]

    def snapshot(self, table_url: str, version: int) -> Snapshot:
        configuration = _as_dict(self.metadata.get("configuration"))
        features = frozenset(self.protocol.get("readerFeatures") or ())
        return Snapshot(
            version=version,
            file_urls=tuple(sorted(_file_url(table_url, path) for path in self.files)),
            partition_columns=tuple(self.metadata.get("partitionColumns") or ()),
            column_mapping=configuration.get("delta.columnMapping.mode", "none"),
            reader_features=features,
            has_deletion_vectors=any(add.get("deletionVector") for add in self.files.values()),
        )


def _as_dict(value: Any) -> dict[str, str]:
    """A map column read from a checkpoint comes as [(key, value)] pairs."""
    if isinstance(value, list):
        return dict(value)
    return dict(value or {})


def _file_url(table_url: str, path: str) -> str:
    """An `add.path`: a URL-encoded path relative to the table, or an absolute URI."""
    if urlparse(path).scheme:
        return path
    return fs.join_url(table_url, unquote(path))
