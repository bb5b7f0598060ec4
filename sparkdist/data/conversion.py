"""``make_spark_converter``: a Spark DataFrame to a handle from which every rank reads its rows.

A DataFrame that is a plain Parquet scan, or a Delta table's current files, optionally with
some columns selected, is read where it lies: nothing is written (`sparkdist.data.sources`).
Any other DataFrame is written once per plan as Parquet under the cache directory
(`sparkdist.data.cache`), compressed with ``DEFAULT_COMPRESSION_CODEC``, with progress on
the driver (`sparkdist.data.progress`). Either way, columns the ranks could not batch are
refused here, on the driver, naming the column and the fix: unsupported types before any
Spark job, null values and ragged arrays from aggregates computed while Spark writes the
copy (or in one pass over the columns of a source read in place whose statistics do not
settle it).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkdist.data import cache, fs
from sparkdist.data.converter import SparkDatasetConverter, choose_backend
from sparkdist.data.progress import WriteProgress
from sparkdist.data.reader import describe
from sparkdist.data.schema import check_dtype, check_values, prepare_dataframe, value_checks
from sparkdist.data.sources import find_direct_source
from sparkdist.spark import jobs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

logger = logging.getLogger(__name__)

DEFAULT_ROW_GROUP_SIZE_BYTES = 32 * 1024 * 1024
# Chosen by benchmarks/data_reader.py --codecs (README, "Data"): zstd saved 10-14% more disk
# than snappy but halved the read speed of float features; snappy and lz4_raw saved the same
# and read as fast (within noise), and every Parquet reader knows snappy (Spark's default).
DEFAULT_COMPRESSION_CODEC = "snappy"
COMPRESSION_CODECS = ("uncompressed", "snappy", "gzip", "lz4", "lz4_raw", "zstd")


@dataclass(frozen=True)
class Conversion:
    """A converter, and whether making it wrote a new copy (its maker may remove it)."""

    converter: SparkDatasetConverter
    wrote_copy: bool


def make_spark_converter(
    df: DataFrame,
    parquet_row_group_size_bytes: int = DEFAULT_ROW_GROUP_SIZE_BYTES,
    compression_codec: str | None = None,
    dtype: str | None = "float32",
    *,
    cache_dir_url: str | None = None,
    backend: str = "auto",
) -> SparkDatasetConverter:
    """A handle on ``df``'s rows for the ranks: its source files, or a copy written once.

    ``dtype`` ("float32", "float64" or None) sets the precision of float columns and of
    Spark ML vectors, which become fixed-length arrays. A copy goes under ``cache_dir_url``,
    else the Spark conf ``spark.sparkdist.cacheDirUrl`` (or petastorm's
    ``petastorm.spark.converter.parentCacheDirUrl``); local Spark defaults to the temp dir.
    ``compression_codec`` (None: ``DEFAULT_COMPRESSION_CODEC``) and
    ``parquet_row_group_size_bytes`` apply to a copy. ``backend`` is "auto", "pyarrow" or
    "petastorm". Raises ValueError naming the columns that cannot be batched.
    """
    return convert(
        df,
        parquet_row_group_size_bytes,
        compression_codec,
        dtype,
        cache_dir_url=cache_dir_url,
        backend=backend,
    ).converter


def convert(
    df: DataFrame,
    parquet_row_group_size_bytes: int = DEFAULT_ROW_GROUP_SIZE_BYTES,
    compression_codec: str | None = None,
    dtype: str | None = "float32",
    *,
    cache_dir_url: str | None = None,
    backend: str = "auto",
) -> Conversion:
    """``make_spark_converter``, also saying whether this call wrote the copy."""
    check_dtype(dtype)
    codec = (compression_codec or DEFAULT_COMPRESSION_CODEC).lower()
    if codec not in COMPRESSION_CODECS:
        raise ValueError(f"compression_codec must be None or one of {COMPRESSION_CODECS}")
    if parquet_row_group_size_bytes < 1024:
        raise ValueError("parquet_row_group_size_bytes must be at least 1024")
    prepared = prepare_dataframe(df, dtype)  # refuses unsupported types, by column
    chosen = choose_backend(backend)
    direct = find_direct_source(df, dtype)
    if direct is not None:
        logger.info(
            "sparkdist.data: the ranks read the %d files of the %s source in place (%d rows, "
            "%s): nothing written to the cache",
            len(direct.layout.file_urls),
            direct.kind,
            direct.layout.num_rows,
            fs.human_bytes(direct.file_bytes),
        )
        converter = SparkDatasetConverter(None, direct.layout, chosen, dtype, direct.kind)
        return Conversion(converter, wrote_copy=False)

    spark = df.sparkSession
    parent_url = cache.parent_cache_dir_url_for(spark, cache_dir_url)
    max_age = cache.max_age_for(spark)
    cache.set_max_age(max_age)
    cache.sweep_stale(parent_url, max_age)

    def write(url: str) -> None:
        _write_copy(prepared, url, codec, parquet_row_group_size_bytes)
        source = _source_bytes(df)
        if source:
            logger.info("sparkdist.data: the copy's source files hold %s", fs.human_bytes(source))

    options = (dtype, parquet_row_group_size_bytes, codec)
    url, reused = cache.write_once(df, parent_url, options, write)
    converter = SparkDatasetConverter(url, describe(url), chosen, dtype, "copy")
    return Conversion(converter, wrote_copy=not reused)


def _write_copy(prepared: DataFrame, url: str, codec: str, row_group_bytes: int) -> None:
    """Spark writes the rows to `url`, checking their values as they pass; logged with size."""
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
            f"from cache_dir_url= or {cache.CACHE_DIR_CONF}): {_short(error)}"
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
