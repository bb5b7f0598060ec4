"""A Delta table's current files, read from its transaction log with pyarrow.

A Delta table is Parquet files plus `_delta_log/`: JSON commits (`<version>.json`, one
action per line: `add`, `remove`, `metaData`, `protocol`, ...) and, every so often, a
Parquet checkpoint holding the state up to its version (`_last_checkpoint` names the
newest). Replaying the newest checkpoint and the commits after it gives the snapshot: the
files whose rows the table holds now. Ranks can read those files as they are unless the
table needs more than Parquet to be read right, which `Snapshot.refusal` names: deletion
vectors (rows deleted outside the files), column mapping (columns renamed in the log
only), or a reader feature this replay does not know.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sparkdist.data import fs

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
