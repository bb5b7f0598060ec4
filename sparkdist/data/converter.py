"""``SparkDatasetConverter``: the handle ``make_spark_converter`` returns, and its loaders.

The shape is petastorm's (``make_torch_dataloader``, ``make_tf_dataset``, ``len()``,
``delete()``) so code written for it carries over. The handle holds only URLs and row
counts: it is small and cloudpicklable, so the runner can ship it to the ranks, where each
one opens its own shard (by default the one named by env RANK / WORLD_SIZE). How a
DataFrame becomes one is `sparkdist.data.conversion`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from sparkdist.data import cache, petastorm_backend
from sparkdist.data.reader import Layout, ShardReader, default_shard

if TYPE_CHECKING:
    from sparkdist.data.tf_dataset import TFDatasetContext
    from sparkdist.data.torch_loader import TorchLoaderContext

logger = logging.getLogger(__name__)

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
    """A DataFrame's rows as Parquet files; makes PyTorch loaders and tf.data datasets.

    Picklable and small (URLs and row counts), so it can travel to the ranks.
    ``cache_dir_url`` is the copy's directory, or None when the ranks read the source's
    own files (``source`` "parquet" or "delta"; "copy" otherwise).
    """

    # petastorm's constant, for code written against it: our conf name (petastorm's own
    # name, "petastorm.spark.converter.parentCacheDirUrl", is honoured too).
    PARENT_CACHE_DIR_URL_CONF: ClassVar[str] = cache.CACHE_DIR_CONF

    cache_dir_url: str | None
    layout: Layout
    backend: str = "pyarrow"
    dtype: str | None = "float32"
    source: str = "copy"

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
        """Remove the cached copy; the same DataFrame is written anew if converted again.

        A converter that reads its source in place has no copy: the source stays.
        """
        if self.cache_dir_url is None:
            logger.info(
                "sparkdist.data: nothing to delete: the ranks read the %s source", self.source
            )
            return
        cache.delete(self.cache_dir_url)
