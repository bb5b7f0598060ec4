"""Directory URLs as Spark writes them, opened with pyarrow's file systems.

Spark and pyarrow name some stores differently (``s3a://`` vs ``s3://``, ``dbfs:/`` vs the
mounts Databricks gives every node), so both sides go through here. On Databricks,
``dbfs:/Volumes/<catalog>/<schema>/<volume>/...`` (Unity Catalog volumes) is mounted at
``/Volumes/...``; every other ``dbfs:/`` path (``dbfs:/tmp``, ``dbfs:/mnt/...``) at ``/dbfs/...``.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq


def normalize_dir_url(url: str) -> str:
    """A directory URL with a scheme and no trailing slash; plain paths become file URLs."""
    url = url.strip()
    if not url:
        raise ValueError("the cache directory URL is empty")
    if not urlparse(url).scheme:
        return Path(os.path.abspath(url)).as_uri()
    return url.rstrip("/") if len(url) > 1 else url


def join_url(dir_url: str, name: str) -> str:
    return f"{dir_url.rstrip('/')}/{name}"


def filesystem_and_path(url: str) -> tuple[pafs.FileSystem, str]:
    """pyarrow's file system and path for a URL that Spark understood."""
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme in ("", "file"):
        path = unquote(parsed.path) if scheme else url
        return pafs.LocalFileSystem(), path
    if scheme == "dbfs":
        return pafs.LocalFileSystem(), dbfs_mount_path(unquote(parsed.path))
    if scheme in ("s3a", "s3n"):
        url = "s3" + url[len(scheme) :]
    return pafs.FileSystem.from_uri(url)


class NotReadable(Exception):
    """The files cannot be read as they are; the message says why (for a log line)."""


def locate(url: str) -> tuple[pafs.FileSystem, str]:
    """pyarrow's file system and path for ``url``; `NotReadable` when it has none."""
    try:
        return filesystem_and_path(url)
    except (OSError, ValueError, pa.ArrowException) as error:
        raise NotReadable(f"pyarrow cannot read {url} ({error})") from error


def open_parquet(url: str, footer: pq.FileMetaData | None = None) -> pq.ParquetFile:
    """A Parquet file, opened to be read row group by row group; ``footer``: its
    metadata, read already (a wide file's footer costs about 0.25 ms to read again)."""
    filesystem, path = filesystem_and_path(url)
    source = filesystem.open_input_file(path)
    if isinstance(filesystem, pafs.LocalFileSystem):
        # Local and FUSE-mounted files (/dbfs, /Volumes): pages stream through a 1 MiB
        # buffer as they are decoded, instead of a whole column chunk (128 MiB in a Spark
        # row group) read into fresh memory first: half the memory, and no slower.
        return pq.ParquetFile(source, metadata=footer, pre_buffer=False, buffer_size=1 << 20)
    return pq.ParquetFile(source, metadata=footer)  # object stores: whole column chunks


def dbfs_mount_path(path: str) -> str:
    """Where Databricks mounts the DBFS path `path` (of a ``dbfs:`` URL) on every node."""
    path = "/" + path.lstrip("/")
    if path == "/Volumes" or path.startswith("/Volumes/"):
        return path
    return "/dbfs" + path


def size_of(url: str) -> tuple[int, int]:
    """(bytes, files) under a directory URL, or of one file; (0, 0) when it is not there."""
    fs, path = filesystem_and_path(url)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        return info.size or 0, 1
    if info.type != pafs.FileType.Directory:
        return 0, 0
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    files = [i for i in infos if i.type == pafs.FileType.File]
    return sum(i.size or 0 for i in files), len(files)


def human_bytes(size: float) -> str:
    """1536 -> '1.5 KiB', for log lines."""
    if abs(size) < 1024:
        return f"{size:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if abs(size) < 1024 or unit == "GiB":
            break
    return f"{size:.1f} {unit}"


def delete_dir(url: str) -> bool:
    """Remove a directory and everything under it; False when it was not there."""
    fs, path = filesystem_and_path(url)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return False
    fs.delete_dir(path)
    return True


def exists(url: str) -> bool:
    fs, path = filesystem_and_path(url)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def list_parquet_files(dir_url: str) -> list[str]:
    """The data files Spark wrote under a directory (not _SUCCESS, .crc, ...), sorted."""
    fs, path = filesystem_and_path(dir_url)
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    files = []
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        name = info.base_name
        if name.startswith(("_", ".")) or not name.endswith(".parquet"):
            continue
        relative = info.path[len(path) :].lstrip("/")
        files.append(join_url(dir_url, relative))
    return sorted(files)
