"""Where converted DataFrames live as Parquet, written once per DataFrame, and removed again.

The parent directory comes from ``cache_dir_url=``, else the Spark conf
``spark.sparkdist.cacheDirUrl``, else (local Spark only) the system temp dir. On a cluster
there is no safe default: executors write and every rank reads, so it must be storage
they all share, and only the user knows which.

A DataFrame is recognised by its plan: ``df.semanticHash()`` narrows the search and
``df.sameSemantics()`` confirms it, as petastorm does with the analyzed plan. The
registry lives in the driver process; an atexit hook removes what this process wrote.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import tempfile
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkdist.data import fs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

logger = logging.getLogger(__name__)

CACHE_DIR_CONF = "spark.sparkdist.cacheDirUrl"


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
        return fs.normalize_dir_url(chosen)
    if is_local_master(master):
        return local_default_cache_dir_url()
    raise ValueError(
        f"make_spark_converter needs a cache directory that the executors and every rank can "
        f"reach (Spark master is {master!r}). Set the Spark conf {CACHE_DIR_CONF}, e.g. "
        f"spark.conf.set('{CACHE_DIR_CONF}', 'file:/dbfs/tmp/sparkdist-cache'), "
        f"or pass cache_dir_url= to make_spark_converter."
    )


def parent_cache_dir_url_for(spark: Any, cache_dir_url: str | None = None) -> str:
    """``resolve_parent_cache_dir_url`` for a live SparkSession."""
    master = spark.conf.get("spark.master", "") or ""
    conf_value = spark.conf.get(CACHE_DIR_CONF, None)
    return resolve_parent_cache_dir_url(master, conf_value, cache_dir_url)


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
        try:
            write(url)
        except BaseException:
            try:
                fs.delete_dir(url)
            except Exception:  # the write's own error is the one to report
                pass
            raise
        _entries.append(_Entry(df=df, plan_hash=plan_hash, options=key, url=url))
        _written_here.add(url)
        return url, False


def delete(url: str) -> None:
    """Remove a cache directory and forget it, so the same DataFrame is written anew."""
    with _lock:
        _entries[:] = [entry for entry in _entries if entry.url != url]
        _written_here.discard(url)
    if fs.delete_dir(url):
        logger.info("sparkdist.data: deleted the cached copy at %s", url)


def _delete_all_at_exit() -> None:
    for url in sorted(_written_here):
        try:
            fs.delete_dir(url)
        except Exception as exc:  # best effort while the interpreter exits
            logger.warning("sparkdist.data: could not delete %s at exit: %r", url, exc)
    _written_here.clear()


atexit.register(_delete_all_at_exit)
