"""Writes a DataFrame's copy as Parquet with Spark, checking its values as they pass.

The copy goes where `sparkdist.data.cache` says, once per plan; this module is the Spark
job itself: the rows written compressed in row groups of a chosen size, an Observation
counting null values and array lengths on the way (`value_checks`; `check_values` refuses
them by column name afterwards, so that the failed copy is removed), progress on the
driver (`WriteProgress`, below), and the copy's size logged. A source read in place is
checked with the same aggregates, in one Spark pass (`sparkdist.data.driver.sources`).

`WriteProgress`: Spark writing a copy, shown on the driver (files, rows and bytes so far).

Spark's write is one action that says nothing until it ends, so a thread watches the
output directory instead: a task's file counts once its task committed it (it is no
longer under an ``attempt_`` directory), and its rows come from its Parquet footer. The
display is sparkdist's one progress display (`sparkdist.progress`: a bar in a notebook or
terminal, plain lines elsewhere, nothing when the `sparkdist` logger is above INFO).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sparkdist import progress
from sparkdist.data import fs
from sparkdist.data.cache import CACHE_DIR_CONF
from sparkdist.spark import jobs

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

logger = logging.getLogger(__name__)

POLL_SECONDS = 1.0
"""How often `WriteProgress` looks at the output directory."""


def write_copy(
    prepared: DataFrame, source: DataFrame, codec: str, row_group_bytes: int, url: str
) -> None:
    """Spark writes ``prepared`` (``source`` shaped for the ranks) to ``url``, checking
    its values as they pass; logged with the sizes of the copy and of the source's files."""
    from pyspark.sql import Observation
    from pyspark.sql import types as T

    names = prepared.columns
    arrays = [f.name for f in prepared.schema.fields if isinstance(f.dataType, T.ArrayType)]
    observation = Observation(f"sparkdist_checks_{uuid.uuid4().hex[:8]}")
    checked = prepared.observe(observation, *value_checks(names, arrays))
    logger.info("sparkdist.data: writing the DataFrame as Parquet (%s) to %s", codec, url)
    started = time.monotonic()
    try:
        description = f"sparkdist data: copy of a DataFrame ({len(names)} columns) to {url}"
        with jobs.described(prepared.sparkSession, description), WriteProgress(url):
            (
                checked.write.option("compression", codec)
                .option("parquet.block.size", str(row_group_bytes))
                .parquet(url)
            )
    except Exception as error:
        raise RuntimeError(
            f"Spark could not write the DataFrame as Parquet to {url} (cache directory "
            f"from cache_dir_url= or {CACHE_DIR_CONF}): {_short(error)}"
        ) from error
    seconds = time.monotonic() - started
    metrics = observation.get
    check_values(metrics, names, arrays)  # raises; the failed copy is then removed
    size, files = fs.size_of(url)
    logger.info(
        "sparkdist.data: wrote a copy of %d rows to %s: %s in %d files, %.1f s",
        metrics["rows"],
        url,
        fs.human_bytes(size),
        files,
        seconds,
    )
    source_bytes = _source_bytes(source)
    if source_bytes:
        logger.info("sparkdist.data: the copy's source files hold %s", fs.human_bytes(source_bytes))


def value_checks(columns: Sequence[str], arrays: Sequence[str]) -> list[Column]:
    """Aggregates that find null values in `columns` and ragged or holed `arrays`.

    Computed while Spark writes the copy (an Observation), or in one pass over a source
    that is read in place; `check_values` turns the result into an error.
    """
    from pyspark.sql import functions as F

    checks = [F.count(F.lit(1)).alias("rows")]
    for i, name in enumerate(columns):
        checks.append(F.count_if(F.col(f"`{name}`").isNull()).alias(f"nulls{i}"))
    for i, name in enumerate(arrays):
        column = F.col(f"`{name}`")
        checks += [
            F.min(F.size(column)).alias(f"shortest{i}"),
            F.max(F.size(column)).alias(f"longest{i}"),
            F.count_if(F.exists(column, lambda value: value.isNull())).alias(f"holed{i}"),
        ]
    return checks


def check_values(metrics: dict, columns: Sequence[str], arrays: Sequence[str]) -> dict[str, int]:
    """Raise ValueError naming every column with nulls, ragged arrays or null elements.

    Returns each array column's length (what every row holds).
    """
    problems = []
    rows = metrics["rows"]
    for i, name in enumerate(columns):
        nulls = metrics[f"nulls{i}"]
        if nulls:
            problems.append(
                f"column '{name}' has {nulls} null values (of {rows} rows): fill or drop them, "
                f"e.g. df.na.fill(0, subset=['{name}']) or df.na.drop(subset=['{name}'])"
            )
    lengths = {}
    for i, name in enumerate(arrays):
        shortest, longest = metrics[f"shortest{i}"], metrics[f"longest{i}"]
        if shortest is not None and longest is not None and shortest != longest:
            problems.append(
                f"column '{name}' holds arrays of different lengths ({shortest} to {longest} "
                f"elements): only fixed-length arrays can be batched; pad or cut them to one "
                f"length n, e.g. F.slice(F.concat('{name}', F.array_repeat(F.lit(0.0), n)), 1, n)"
            )
        holed = metrics[f"holed{i}"]
        if holed:
            problems.append(
                f"column '{name}' has {holed} arrays with null elements: fill them, e.g. "
                f"F.transform('{name}', lambda v: F.coalesce(v, F.lit(0.0)))"
            )
        lengths[name] = max(longest or 0, 0)
    if problems:
        raise ValueError("make_spark_converter cannot batch this DataFrame: " + "; ".join(problems))
    return lengths


def _source_bytes(df: DataFrame) -> int:
    """Bytes of the files `df` reads (0 when it reads none, or they cannot be listed)."""
    try:
        return sum(fs.size_of(url)[0] for url in df.inputFiles()[:10_000])
    except Exception:  # noqa: BLE001 - only for a log line
        return 0


def _short(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = " ".join(lines[:2]) if lines else type(error).__name__
    return text[:500]


class WriteProgress:
    """Context manager: watch `url` while Spark writes Parquet into it."""

    def __init__(self, url: str, *, enabled: bool | None = None) -> None:
        self.url = url
        self.enabled = progress.mode() != "off" if enabled is None else enabled
        self.rows = 0
        self.files = 0
        self.bytes = 0
        self._counted: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: progress.Bar | None = None

    def __enter__(self) -> WriteProgress:
        if self.enabled:
            self._bar = progress.bar(None, "sparkdist: writing the copy", unit="rows")
            self._thread = threading.Thread(target=self._watch, name="sparkdist-write-progress")
            self._thread.daemon = True
            self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._bar is not None:
            self._bar.close()

    def _watch(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            try:
                self._scan()
            except Exception as exc:  # the directory moves under us at job commit
                logger.debug("sparkdist.data: progress scan of %s: %r", self.url, exc)
                continue
            self._bar.set(self.rows, files=self.files, size=fs.human_bytes(self.bytes))

    def _scan(self) -> None:
        """Count the Parquet files tasks have committed so far (each once, by name)."""
        filesystem, path = fs.filesystem_and_path(self.url)
        if filesystem.get_file_info(path).type != pafs.FileType.Directory:
            return
        for info in filesystem.get_file_info(pafs.FileSelector(path, recursive=True)):
            name = info.base_name
            if info.type != pafs.FileType.File or not name.endswith(".parquet"):
                continue
            if "/attempt_" in info.path or name in self._counted:
                continue  # still being written, or seen before (files move at job commit)
            with filesystem.open_input_file(info.path) as handle:
                self.rows += pq.ParquetFile(handle).metadata.num_rows
            self._counted.add(name)
            self.files += 1
            self.bytes += info.size or 0
