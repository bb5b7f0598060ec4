"""``make_spark_converter``: a Spark DataFrame as Parquet once, then read by every rank.

The shape is petastorm's (``make_spark_converter(df)``, ``make_torch_dataloader``,
``make_tf_dataset``, ``len()``, ``delete()``) so code written for it carries over. The
returned handle holds only URLs and row counts: it is small and cloudpicklable, so the
runner can ship it to the ranks, where each one opens its own shard (by default the one
named by env RANK / WORLD_SIZE).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkdist.data import cache, petastorm_backend
from sparkdist.data.reader import Layout, ShardReader, default_shard, describe
from sparkdist.data.schema import check_dtype, prepare_dataframe

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from sparkdist.data.tf_dataset import TFDatasetContext
    from sparkdist.data.torch_loader import TorchLoaderContext

logger = logging.getLogger(__name__)

DEFAULT_ROW_GROUP_SIZE_BYTES = 32 * 1024 * 1024
COMPRESSION_CODECS = ("uncompressed", "snappy", "gzip", "lz4", "zstd")
BACKENDS = ("auto", "pyarrow", "petastorm")


def choose_backend(backend: str = "auto") -> str:
    """ "petastorm" where it imports (and is wanted), else "pyarrow"; the choice is logged."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
    if backend == "pyarrow":
        logger.info("sparkdist.data: using the pyarrow reader (asked for)")
        return "pyarrow"
    version, reason = petastorm_backend.petastorm_status()
    if version is not None:
        logger.info("sparkdist.data: using petastorm %s", version)
        return "petastorm"
    if backend == "petastorm":
        raise ImportError(f"backend='petastorm' was asked for, but petastorm is unusable: {reason}")
    logger.info("sparkdist.data: using the pyarrow reader (petastorm unavailable: %s)", reason)
    return "pyarrow"


@dataclass(frozen=True)
class SparkDatasetConverter:
    """A DataFrame materialized as Parquet; makes PyTorch loaders and tf.data datasets.

    Picklable and small (URLs and row counts), so it can travel to the ranks.
    """

    cache_dir_url: str
    layout: Layout
    backend: str = "pyarrow"
    dtype: str | None = "float32"

    def __len__(self) -> int:
        return self.layout.num_rows

    @property
    def dataset_size(self) -> int:
        """Rows in the whole dataset (petastorm's name for ``len()``)."""
        return self.layout.num_rows

    @property
    def file_urls(self) -> list[str]:
        return list(self.layout.file_urls)

    def _use_petastorm(self, shard_count: int) -> bool:
        if self.backend != "petastorm":
            return False
        version, reason = petastorm_backend.petastorm_status()
        if version is None:
            logger.warning(
                "sparkdist.data: petastorm was chosen on the driver but is unusable here (%s); "
                "using the pyarrow reader",
                reason,
            )
            return False
        if self.layout.num_row_groups < shard_count:
            logger.info(
                "sparkdist.data: %d row groups for %d shards: petastorm shards by row group, "
                "so the pyarrow reader (row ranges) reads this one",
                self.layout.num_row_groups,
                shard_count,
            )
            return False
        return True

    def _reader(self, **kwargs: Any) -> ShardReader:
        return ShardReader(self.layout, **kwargs)

    def make_torch_dataloader(
        self,
        batch_size: int = 32,
        num_epochs: int | None = None,
        shuffle: bool = False,
        cur_shard: int | None = None,
        shard_count: int | None = None,
        *,
        seed: int | None = None,
        shuffle_buffer_rows: int | None = None,
        columns: Sequence[str] | None = None,
        prefetch: int = 2,
        workers_count: int | None = None,
    ) -> TorchLoaderContext | Any:
        """Context manager giving an iterable of ``{column: tensor}`` batches of this shard.

        ``num_epochs=None`` repeats forever. ``cur_shard``/``shard_count`` default to env
        RANK/WORLD_SIZE (else the whole dataset). ``shuffle`` reorders row groups per epoch
        and rows within ``shuffle_buffer_rows``. ``workers_count`` is for petastorm only.
        Shards differ by at most one row, so their batch counts can differ by one: for DDP,
        use ``num_epochs=None`` and a fixed number of steps, e.g.
        ``len(converter) // (batch_size * world_size)`` per epoch.
        """
        cur_shard, shard_count = default_shard(cur_shard, shard_count)
        if self._use_petastorm(shard_count):
            return petastorm_backend.torch_context(
                self.cache_dir_url,
                self.layout,
                batch_size=batch_size,
                num_epochs=num_epochs,
                shuffle=shuffle,
                seed=seed,
                shuffle_buffer_rows=shuffle_buffer_rows or 8192,
                cur_shard=cur_shard,
                shard_count=shard_count,
                columns=columns,
                workers_count=workers_count,
            )
        from sparkdist.data.torch_loader import TorchLoaderContext

        reader = self._reader(
            batch_size=batch_size,
            num_epochs=num_epochs,
            cur_shard=cur_shard,
            shard_count=shard_count,
            shuffle=shuffle,
            seed=seed,
            shuffle_buffer_rows=shuffle_buffer_rows,
            columns=columns,
            prefetch=prefetch,
            writable=True,
        )
        return TorchLoaderContext(reader)

    def make_tf_dataset(
        self,
        batch_size: int | None = None,
        num_epochs: int | None = None,
        shuffle: bool = False,
        cur_shard: int | None = None,
        shard_count: int | None = None,
        *,
        seed: int | None = None,
        shuffle_buffer_rows: int | None = None,
        columns: Sequence[str] | None = None,
        prefetch: int | None = None,
        workers_count: int | None = None,
    ) -> TFDatasetContext | Any:
        """Context manager giving a ``tf.data.Dataset`` of namedtuple batches of this shard.

        ``batch_size=None`` means 32, as in petastorm; ``prefetch=None`` means AUTOTUNE.
        The other arguments are those of ``make_torch_dataloader``.
        """
        batch_size = batch_size or 32
        cur_shard, shard_count = default_shard(cur_shard, shard_count)
        if self._use_petastorm(shard_count):
            return petastorm_backend.tf_context(
                self.cache_dir_url,
                self.layout,
                batch_size=batch_size,
                num_epochs=num_epochs,
                shuffle=shuffle,
                seed=seed,
                shuffle_buffer_rows=shuffle_buffer_rows or 8192,
                cur_shard=cur_shard,
                shard_count=shard_count,
                columns=columns,
                workers_count=workers_count,
                prefetch=prefetch,
            )
        from sparkdist.data.tf_dataset import TFDatasetContext

        reader = self._reader(
            batch_size=batch_size,
            num_epochs=num_epochs,
            cur_shard=cur_shard,
            shard_count=shard_count,
            shuffle=shuffle,
            seed=seed,
            shuffle_buffer_rows=shuffle_buffer_rows,
            columns=columns,
        )
        return TFDatasetContext(reader, prefetch)

    def delete(self) -> None:
        """Remove the cached Parquet; the same DataFrame is written anew if converted again."""
        cache.delete(self.cache_dir_url)


def _short(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = " ".join(lines[:2]) if lines else type(error).__name__
    return text[:500]


def make_spark_converter(
    df: DataFrame,
    parquet_row_group_size_bytes: int = DEFAULT_ROW_GROUP_SIZE_BYTES,
    compression_codec: str | None = None,
    dtype: str | None = "float32",
    *,
    cache_dir_url: str | None = None,
    backend: str = "auto",
) -> SparkDatasetConverter:
    """Write ``df`` as Parquet under the cache directory (once per plan) and return a handle.

    ``dtype`` ("float32", "float64" or None) sets the precision of float columns and of
    Spark ML vectors, which become fixed-length arrays. ``cache_dir_url`` overrides the
    Spark conf ``spark.sparkdist.cacheDirUrl``; local Spark defaults to the temp dir.
    ``backend`` is "auto" (petastorm where it imports, else pyarrow), "pyarrow" or
    "petastorm". Unsupported column types are refused here, by name.
    """
    check_dtype(dtype)
    codec = (compression_codec or "uncompressed").lower()
    if codec not in COMPRESSION_CODECS:
        raise ValueError(f"compression_codec must be None or one of {COMPRESSION_CODECS}")
    if parquet_row_group_size_bytes < 1024:
        raise ValueError("parquet_row_group_size_bytes must be at least 1024")
    prepared = prepare_dataframe(df, dtype)
    chosen = choose_backend(backend)
    parent_url = cache.parent_cache_dir_url_for(df.sparkSession, cache_dir_url)

    def write(url: str) -> None:
        logger.info("sparkdist.data: writing the DataFrame as Parquet to %s", url)
        try:
            (
                prepared.write.option("compression", codec)
                .option("parquet.block.size", str(parquet_row_group_size_bytes))
                .parquet(url)
            )
        except Exception as error:
            raise RuntimeError(
                f"Spark could not write the DataFrame as Parquet to {url} (cache directory "
                f"from cache_dir_url= or {cache.CACHE_DIR_CONF}): {_short(error)}"
            ) from error

    options = (dtype, parquet_row_group_size_bytes, codec)
    url, _ = cache.write_once(df, parent_url, options, write)
    return SparkDatasetConverter(url, describe(url), chosen, dtype)
