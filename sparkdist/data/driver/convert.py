"""``make_spark_converter``: a Spark DataFrame to a handle from which every rank reads its rows.

A DataFrame that is a plain Parquet scan, or a Delta table's current files, optionally with
some columns selected, is read where it lies: nothing is written (`sparkdist.data.driver.sources`).
Any other DataFrame is written once per plan as Parquet under the cache directory
(`sparkdist.data.cache`, `sparkdist.data.driver.writer`), compressed with
``DEFAULT_COMPRESSION_CODEC``, with progress on the driver. Either way, columns the ranks
could not batch are refused here, on the driver, naming the column and the fix:
unsupported types before any Spark job, null values and ragged arrays from aggregates
computed while Spark writes the copy (or in one pass over the columns of a source read in
place whose statistics do not settle it).
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkdist.data import cache, fs, petastorm_backend
from sparkdist.data.converter import SparkDatasetConverter
from sparkdist.data.driver import writer
from sparkdist.data.driver.schema import check_dtype, prepare_dataframe
from sparkdist.data.driver.sources import find_direct_source
from sparkdist.data.layout import describe

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

logger = logging.getLogger(__name__)

DEFAULT_ROW_GROUP_SIZE_BYTES = 32 * 1024 * 1024
# Chosen by benchmarks/data_reader.py --codecs (docs/data.md, "Codec"): zstd saved 10-14% more disk
# than snappy but halved the read speed of float features; snappy and lz4_raw saved the same
# and read as fast (within noise), and every Parquet reader knows snappy (Spark's default).
DEFAULT_COMPRESSION_CODEC = "snappy"
COMPRESSION_CODECS = ("uncompressed", "snappy", "gzip", "lz4", "lz4_raw", "zstd")
BACKENDS = ("auto", "pyarrow", "petastorm")
# What the torch loader gives: petastorm's types (booleans as torch.uint8) for code written
# against petastorm, or torch's own (torch.bool) for the runner's DataFrame arguments.
TENSOR_TYPES = ("petastorm", "torch")


@dataclass(frozen=True)
class ConversionOptions:
    """``make_spark_converter``'s options as one value, checked when made."""

    parquet_row_group_size_bytes: int = DEFAULT_ROW_GROUP_SIZE_BYTES
    compression_codec: str | None = None
    dtype: str | None = "float32"
    cache_dir_url: str | None = None
    backend: str = "auto"
    tensor_types: str = "petastorm"

    def __post_init__(self) -> None:
        check_dtype(self.dtype)
        if self.tensor_types not in TENSOR_TYPES:
            raise ValueError(
                f"tensor_types must be one of {TENSOR_TYPES}, not {self.tensor_types!r}"
            )
        if self.codec not in COMPRESSION_CODECS:
            raise ValueError(f"compression_codec must be None or one of {COMPRESSION_CODECS}")
        if self.parquet_row_group_size_bytes < 1024:
            raise ValueError("parquet_row_group_size_bytes must be at least 1024")

    @property
    def codec(self) -> str:
        return (self.compression_codec or DEFAULT_COMPRESSION_CODEC).lower()


@dataclass(frozen=True)
class Conversion:
    """A converter, and whether making it wrote a new copy (its maker may remove it)."""

    converter: SparkDatasetConverter
    wrote_copy: bool


def make_spark_converter(
    df: DataFrame | str | os.PathLike,
    parquet_row_group_size_bytes: int = DEFAULT_ROW_GROUP_SIZE_BYTES,
    compression_codec: str | None = None,
    dtype: str | None = "float32",
    *,
    cache_dir_url: str | None = None,
    backend: str = "auto",
    tensor_types: str = "petastorm",
) -> SparkDatasetConverter:
    """A handle on ``df``'s rows for the ranks: its source files, or a copy written once.

    ``df`` is a DataFrame, or the path (or URL) of saved Parquet data, read in place.

    ``dtype`` ("float32", "float64" or None) sets the precision of float columns and of
    Spark ML vectors, which become fixed-length arrays. A copy goes under ``cache_dir_url``,
    else the Spark conf ``spark.sparkdist.cacheDirUrl`` (or petastorm's
    ``petastorm.spark.converter.parentCacheDirUrl``); local Spark defaults to the temp dir.
    ``compression_codec`` (None: ``DEFAULT_COMPRESSION_CODEC``) and
    ``parquet_row_group_size_bytes`` apply to a copy. ``backend`` is "auto", "pyarrow" or
    "petastorm". ``tensor_types`` is "petastorm" (the torch loader gives petastorm's types:
    booleans as torch.uint8) or "torch" (torch.bool, as for the runner's DataFrame
    arguments). Raises ValueError naming the columns that cannot be batched.
    """
    options = ConversionOptions(
        parquet_row_group_size_bytes, compression_codec, dtype, cache_dir_url, backend, tensor_types
    )
    return convert(df, options).converter


def convert(
    df: DataFrame | str | os.PathLike, options: ConversionOptions | None = None
) -> Conversion:
    """``make_spark_converter``, also saying whether this call wrote the copy."""
    options = options or ConversionOptions()
    if isinstance(df, str | os.PathLike):
        df = _saved_parquet(df)
    prepared = prepare_dataframe(df, options.dtype)  # refuses unsupported types, by column
    backend = choose_backend(options.backend)
    direct = find_direct_source(df, options.dtype, prepared.vectors)
    if direct is not None:
        logger.info(
            "sparkdist.data: the ranks read the %d files of the %s source in place (%d rows, "
            "%s): nothing written to the cache",
            len(direct.layout.file_urls),
            direct.kind,
            direct.layout.num_rows,
            fs.human_bytes(direct.file_bytes),
        )
        converter = SparkDatasetConverter(
            None, direct.layout, backend, options.dtype, direct.kind, options.tensor_types
        )
        return Conversion(converter, wrote_copy=False)
    size, codec = options.parquet_row_group_size_bytes, options.codec
    write = functools.partial(writer.write_copy, prepared.frame, df, codec, size)
    url, reused = cache.copy_once(df, options.cache_dir_url, (options.dtype, size, codec), write)
    converter = SparkDatasetConverter(
        url, describe(url), backend, options.dtype, "copy", options.tensor_types
    )
    return Conversion(converter, wrote_copy=not reused)


def _saved_parquet(path: str | os.PathLike) -> DataFrame:
    """Saved Parquet data (petastorm takes a path too), through Spark: read in place."""
    from pyspark.sql import SparkSession

    logger.info("sparkdist.data: converting the Parquet data saved at %s", path)
    return SparkSession.builder.getOrCreate().read.parquet(os.fspath(path))


def choose_backend(backend: str = "auto") -> str:
    """The reader to use: pyarrow, unless petastorm is asked for by name; logged.

    "auto" is the pyarrow reader: petastorm is unmaintained, shards by whole row groups
    (unequal steps) and knows nothing of the global order or of resuming.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
    if backend in ("auto", "pyarrow"):
        logger.info("sparkdist.data: using the pyarrow reader")
        return "pyarrow"
    version, reason = petastorm_backend.petastorm_status()
    if version is None:
        raise ImportError(f"backend='petastorm' was asked for, but petastorm is unusable: {reason}")
    logger.info("sparkdist.data: using petastorm %s (asked for)", version)
    return "petastorm"
