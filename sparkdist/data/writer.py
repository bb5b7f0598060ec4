"""Writes a DataFrame's copy as Parquet with Spark, checking its values as they pass.

The copy goes where `sparkdist.data.cache` says, once per plan; this module is the Spark
job itself: the rows written compressed in row groups of a chosen size, an Observation
counting null values and array lengths on the way (`value_checks`; `check_values` refuses
them by column name afterwards, so that the failed copy is removed), progress on the
driver (`sparkdist.data.progress`), and the copy's size logged. A source read in place is
checked with the same aggregates, in one Spark pass (`sparkdist.data.sources`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sparkdist.data import fs
from sparkdist.data.cache import CACHE_DIR_CONF
from sparkdist.data.progress import WriteProgress
from sparkdist.spark import jobs

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

logger = logging.getLogger(__name__)


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
