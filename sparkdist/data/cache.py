"""Where converted DataFrames live as Parquet, written once per DataFrame, and removed again.

The parent directory comes from ``cache_dir_url=``, else the Spark conf
``spark.sparkdist.cacheDirUrl``, else petastorm's ``petastorm.spark.converter.parentCacheDirUrl``,
else (local Spark only) the system temp dir. On a cluster there is no safe default:
executors write and every rank reads, so it must be storage they all share, and only the
user knows which.

A DataFrame is recognised by its plan: ``df.semanticHash()`` narrows the search and
``df.sameSemantics()`` confirms it, as petastorm does with the analyzed plan. The
registry lives in the driver process; an atexit hook removes what this process wrote.

A driver that dies cannot remove its copies, so each copy holds a lease file that its
driver rewrites every ``max_age / 4`` (at most hourly) while it lives, and a conversion
that writes a new copy first removes the copies under the same parent whose lease (or,
without one, whose name's time stamp) is older than ``max_age``: the Spark conf
``spark.sparkdist.cacheMaxAge`` (``"24h"``, ``"90m"``, ``"3600s"``; default 24 hours).
Only directories named as this module names them are ever swept. Every write and removal
is logged with its size.
"""

from __future__ import annotations

import atexit
import datetime
import json
import logging
import os
import re
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pyarrow.fs as pafs

from sparkdist.data import fs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

logger = logging.getLogger(__name__)

CACHE_DIR_CONF = "spark.sparkdist.cacheDirUrl"
# petastorm's name for the same setting (SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF there),
# honoured after ours so that clusters configured for petastorm keep working.
PETASTORM_CACHE_DIR_CONF = "petastorm.spark.converter.parentCacheDirUrl"
MAX_AGE_CONF = "spark.sparkdist.cacheMaxAge"
DEFAULT_MAX_AGE_SECONDS = 24 * 3600
LEASE_FILE = "_sparkdist_lease"
# <yyyymmddHHMMSS>-<app id>-<plan hash>-<random>: what _dir_name makes, and all a sweep touches.
_DIR_NAME = re.compile(r"^(\d{14})-.+-[0-9a-f]{8}-[0-9a-f]{8}$")


def is_local_master(master: str) -> bool:
    """``local``, ``local[*]``, ``local-cluster[...]``: everything on this host."""
    return master.strip().lower().startswith("local")


def local_default_cache_dir_url() -> str:
    return Path(tempfile.gettempdir(), "sparkdist-cache").as_uri()


def resolve_parent_cache_dir_url(
    master: str, conf_value: str | None, cache_dir_url: str | None = None
) -> str:
    """The parent cache directory URL: parameter, then Spark conf, then the local default."""
    chosen = cache_dir_url or conf_value
    if chosen:
        url = fs.normalize_dir_url(chosen)
        _warn_if_local_on_databricks(master, url)
        return url
    if is_local_master(master):
        return local_default_cache_dir_url()
    raise ValueError(
        f"make_spark_converter needs a cache directory that the executors and every rank can "
        f"reach (Spark master is {master!r}). Set the Spark conf {CACHE_DIR_CONF}, e.g. "
        f"spark.conf.set('{CACHE_DIR_CONF}', 'file:/dbfs/tmp/sparkdist-cache'), "
        f"or pass cache_dir_url= to make_spark_converter."
    )


def _warn_if_local_on_databricks(master: str, url: str) -> None:
    """On a Databricks cluster a local directory is one machine's, unless it is a mount."""
    if "DATABRICKS_RUNTIME_VERSION" not in os.environ or is_local_master(master):
        return
    if urlparse(url).scheme != "file":
        return
    path = urlparse(url).path
    if not path.startswith(("/dbfs/", "/Volumes/")):
        logger.warning(
            "sparkdist.data: the cache directory %s is a local path on a Databricks cluster: "
            "every executor writes the copy there and every rank reads it, so it must be "
            "storage they share, such as file:/dbfs/... or /Volumes/... (or an NFS mount on "
            "every node)",
            url,
        )


def parent_cache_dir_url_for(spark: Any, cache_dir_url: str | None = None) -> str:
    """``resolve_parent_cache_dir_url`` for a live SparkSession (ours, then petastorm's conf)."""
    master = spark.conf.get("spark.master", "") or ""
    conf_value = spark.conf.get(CACHE_DIR_CONF, None) or spark.conf.get(
        PETASTORM_CACHE_DIR_CONF, None
    )
    return resolve_parent_cache_dir_url(master, conf_value, cache_dir_url)


def parse_age(value: str) -> float:
    """A Spark time setting ("24h", "90m", "3600s", "1d" or plain seconds) in seconds."""
    units = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
    match = re.fullmatch(r"\s*([0-9.]+)\s*(s|m|min|h|d)?\s*", value.lower())
    if not match:
        raise ValueError(f"{MAX_AGE_CONF} must be a duration such as '24h', '90m' or '3600s'")
    return float(match.group(1)) * units[match.group(2) or "s"]


def max_age_for(spark: Any) -> float:
    """Seconds after which a copy whose lease was not renewed is stale (Spark conf)."""
    value = spark.conf.get(MAX_AGE_CONF, None)
    return parse_age(value) if value else DEFAULT_MAX_AGE_SECONDS


def fingerprint(df: DataFrame) -> int:
    """The DataFrame's plan hash (32 bits, so a match is confirmed with sameSemantics)."""
    return int(df.semanticHash()) & 0xFFFFFFFF


@dataclass
class _Entry:
    df: Any  # the DataFrame, kept to confirm a plan match with sameSemantics
    plan_hash: int
    options: tuple
    url: str


_entries: list[_Entry] = []
_lock = threading.Lock()
_written_here: set[str] = set()
_delete_handler: Callable[[str], None] | None = None  # register_delete_dir_handler's
_lease_refresh_seconds = 3600.0
_lease_thread: threading.Thread | None = None


def _dir_name(df: DataFrame, plan_hash: int) -> str:
    spark = df.sparkSession
    app_id = spark.conf.get("spark.app.id", None) or "app"
    stamp = datetime.datetime.now().strftime("%Y%m%d%H%M%S")
    return f"{stamp}-{app_id}-{plan_hash:08x}-{uuid.uuid4().hex[:8]}"


def _find(df: DataFrame, plan_hash: int, options: tuple) -> _Entry | None:
    for entry in _entries:
        if entry.plan_hash == plan_hash and entry.options == options:
            if entry.df.sameSemantics(df):
                return entry
    return None


def copy_once(
    df: DataFrame, cache_dir_url: str | None, options: tuple, write: Callable[[str], None]
) -> tuple[str, bool]:
    """`write_once` under the parent directory for ``df``'s session (``cache_dir_url``, else
    the Spark conf), after sweeping the stale copies there; (url, reused)."""
    spark = df.sparkSession
    parent_url = parent_cache_dir_url_for(spark, cache_dir_url)
    max_age = max_age_for(spark)
    set_max_age(max_age)
    sweep_stale(parent_url, max_age)
    return write_once(df, parent_url, options, write)


def write_once(
    df: DataFrame, parent_url: str, options: tuple, write: Callable[[str], None]
) -> tuple[str, bool]:
    """The cache directory for ``df`` written with ``options``; (url, reused).

    ``write(url)`` runs only when no copy of the same plan and options exists under
    ``parent_url``. A copy whose directory disappeared is written again; a failed write
    is removed and not remembered.
    """
    plan_hash = fingerprint(df)
    key = (parent_url, *options)
    with _lock:
        entry = _find(df, plan_hash, key)
        if entry is not None:
            if fs.exists(entry.url):
                logger.info("sparkdist.data: reusing the cached copy at %s", entry.url)
                return entry.url, True
            _entries.remove(entry)
        url = fs.join_url(parent_url, _dir_name(df, plan_hash))
        _written_here.add(url)  # removed at exit even if this process dies mid-write
        try:
            write(url)
            _write_lease(url)
        except BaseException:
            _written_here.discard(url)
            try:
                _remove(url, "after a failed write")
            except Exception:  # the write's own error is the one to report
                pass
            raise
        _entries.append(_Entry(df=df, plan_hash=plan_hash, options=key, url=url))
        _start_lease_refresh()
        return url, False


def register_delete_dir_handler(handler: Callable[[str], None] | None) -> None:
    """Remove copies with ``handler(url)`` from now on (petastorm's hook); None: the default.

    The handler serves `delete` and the removal at exit; stale copies of dead drivers are
    still swept by the default.
    """
    global _delete_handler
    _delete_handler = handler


def delete(url: str) -> None:
    """Remove a cache directory and forget it, so the same DataFrame is written anew."""
    with _lock:
        _entries[:] = [entry for entry in _entries if entry.url != url]
        _written_here.discard(url)
    _remove_copy(url, "deleted")


def _remove_copy(url: str, why: str) -> None:
    """Remove a copy this process made: with the registered handler, else `_remove`."""
    if _delete_handler is not None:
        _delete_handler(url)
        logger.info("sparkdist.data: the registered delete handler removed %s (%s)", url, why)
    else:
        _remove(url, why)


def _remove(url: str, why: str) -> bool:
    """Delete one copy and log it with its size; False when it was not there."""
    size, files = fs.size_of(url)
    if not fs.delete_dir(url):
        return False
    logger.info(
        "sparkdist.data: removed the copy at %s (%s, %d files; %s)",
        url,
        fs.human_bytes(size),
        files,
        why,
    )
    return True


def _write_lease(url: str) -> None:
    """Write (or renew) the copy's lease: its mtime says this driver still uses it."""
    filesystem, path = fs.filesystem_and_path(fs.join_url(url, LEASE_FILE))
    owner = {"host": socket.gethostname(), "pid": os.getpid(), "renewed": time.time()}
    with filesystem.open_output_stream(path) as out:
        out.write(json.dumps(owner).encode())


def _start_lease_refresh() -> None:
    global _lease_thread
    if _lease_thread is None or not _lease_thread.is_alive():
        _lease_thread = threading.Thread(
            target=_renew_leases, name="sparkdist-cache-lease", daemon=True
        )
        _lease_thread.start()


def _renew_leases() -> None:
    while True:
        time.sleep(_lease_refresh_seconds)
        with _lock:
            urls = sorted(_written_here)
        for url in urls:
            try:
                _write_lease(url)
            except Exception as exc:  # a lost lease only makes the copy sweepable
                logger.warning("sparkdist.data: could not renew the lease of %s: %r", url, exc)


def set_max_age(max_age: float) -> None:
    """Renew this process's leases often enough for `max_age` (a quarter of it, at most hourly)."""
    global _lease_refresh_seconds
    _lease_refresh_seconds = max(1.0, min(_lease_refresh_seconds, max_age / 4))


def sweep_stale(parent_url: str, max_age: float, now: float | None = None) -> list[str]:
    """Remove the copies under `parent_url` not renewed for `max_age` seconds; their URLs.

    Only directories named as this module names them are looked at; the copies this
    process holds are never stale.
    """
    now = time.time() if now is None else now
    filesystem, path = fs.filesystem_and_path(parent_url)
    if filesystem.get_file_info(path).type != pafs.FileType.Directory:
        return []
    swept = []
    for info in filesystem.get_file_info(pafs.FileSelector(path)):
        match = _DIR_NAME.match(info.base_name)
        url = fs.join_url(parent_url, info.base_name)
        if info.type != pafs.FileType.Directory or not match or url in _written_here:
            continue
        lease = filesystem.get_file_info(f"{info.path}/{LEASE_FILE}")
        if lease.type == pafs.FileType.File and lease.mtime is not None:
            renewed = lease.mtime.timestamp()
        else:  # died while writing: the name's time stamp (local time) is its start
            renewed = time.mktime(time.strptime(match.group(1), "%Y%m%d%H%M%S"))
        if now - renewed > max_age:
            age_hours = (now - renewed) / 3600
            if _remove(url, f"stale: not renewed for {age_hours:.1f} h, over {MAX_AGE_CONF}"):
                swept.append(url)
    return swept


def _delete_all_at_exit() -> None:
    for url in sorted(_written_here):
        try:
            _remove_copy(url, "the driver exits")
        except Exception as exc:  # best effort while the interpreter exits
            logger.warning("sparkdist.data: could not delete %s at exit: %r", url, exc)
    _written_here.clear()


atexit.register(_delete_all_at_exit)
