"""Directory URLs as Spark writes them, opened with pyarrow's file systems.

Spark and pyarrow name some stores differently (``s3a://`` vs ``s3://``, ``dbfs:/`` vs the
``/dbfs`` mount), so both sides go through here.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlparse

import pyarrow.fs as pafs


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
        # Databricks: ranks and driver see DBFS through its FUSE mount.
        return pafs.LocalFileSystem(), "/dbfs" + unquote(parsed.path)
    if scheme in ("s3a", "s3n"):
        url = "s3" + url[len(scheme) :]
    return pafs.FileSystem.from_uri(url)


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
