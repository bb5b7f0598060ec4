"""``SparkDatasetConverter``: the handle ``make_spark_converter`` returns, and its loaders.

The shape is petastorm's (``make_torch_dataloader``, ``make_tf_dataset``, ``len()``,
``delete()``) so code written for it carries over. The handle holds only URLs and row
counts: it is small and cloudpicklable, so the runner can ship it to the ranks, where each
one opens its own shard (by default the one named by env RANK / WORLD_SIZE). How a
DataFrame becomes one is `sparkdist.data.conversion`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from sparkdist.data import cache, petastorm_backend
from sparkdist.data.files import Layout
from sparkdist.data.reader import ReadOptions, ShardReader

if TYPE_CHECKING:
    from sparkdist.data.tf_dataset import TFDatasetContext
    from sparkdist.data.torch_loader import TorchLoaderContext

logger = logging.getLogger(__name__)


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

    def make_torch_dataloader(
        self,
        batch_size: int = 32,
        num_epochs: int | None = None,
        shuffle: bool = False,
        cur_shard: int | None = None,
        shard_count: int | None = None,
        *,
        seed: int | None = None,
        drop_last: bool = False,
        shuffle_buffer_rows: int | None = None,
        shuffling_queue_capacity: int = 0,
        transform_spec: Any = None,
        columns: Sequence[str] | None = None,
        prefetch: int = 2,
        workers_count: int | None = None,
        collate_fn: Callable[[dict], Any] | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        **dataloader_kwargs: Any,
    ) -> TorchLoaderContext | Any:
        """Context manager giving a ``torch.utils.data.DataLoader`` of this rank's batches.

        Batches are ``{column: tensor}`` (or what ``collate_fn`` makes of a
        ``{column: numpy array}`` batch). Rank ``cur_shard`` of ``shard_count`` (default:
        env RANK / WORLD_SIZE, else the whole data) reads its equal slice of each epoch's
        global order: every rank gets the same number of batches (padded, or
        ``drop_last``). ``shuffle`` (or petastorm's ``shuffling_queue_capacity``) draws a
        new global order each epoch from ``seed`` (the same on every rank; default 0).
        Each iteration reads ``num_epochs`` epochs (None: forever) from the loader's
        position, which ``state_dict()`` / ``load_state_dict()`` save and restore.
        ``transform_spec`` is a `TransformSpec`; ``workers_count`` threads decode in
        parallel; a thread reads ``prefetch`` decoded chunks (about 8 MiB each) ahead (0:
        none); ``num_workers`` / ``pin_memory`` / other keywords go to DataLoader.
        """
        options = ReadOptions.of(locals(), writable=True)
        if self._use_petastorm(options.shard_count):
            return petastorm_backend.loader("torch", self.cache_dir_url, self.layout, options)
        from sparkdist.data.torch_loader import TorchLoaderContext

        return TorchLoaderContext(
            ShardReader(self.layout, options),
            collate_fn=collate_fn,
            num_workers=num_workers,
            pin_memory=pin_memory,
            **dataloader_kwargs,
        )

    def make_tf_dataset(
        self,
        batch_size: int | None = None,
        num_epochs: int | None = None,
        shuffle: bool = False,
        cur_shard: int | None = None,
        shard_count: int | None = None,
        *,
        prefetch: int | None = None,  # tf.data's (the reader's own stays at its default)
        seed: int | None = None,
        drop_last: bool = False,
        shuffle_buffer_rows: int | None = None,
        shuffling_queue_capacity: int | None = None,
        transform_spec: Any = None,
        columns: Sequence[str] | None = None,
        workers_count: int | None = None,
    ) -> TFDatasetContext | Any:
        """Context manager giving a ``tf.data.Dataset`` of namedtuple batches of this rank.

        ``batch_size=None`` means 32, as in petastorm; ``prefetch=None`` means AUTOTUNE.
        The other arguments and the guarantees (equal steps, global shuffle, position)
        are those of ``make_torch_dataloader``; ``dataset.steps_per_epoch`` is the number
        of batches per epoch on every rank, for Keras ``fit``.
        """
        options = ReadOptions.of(
            locals(),
            skip=["prefetch"],
            batch_size=batch_size or 32,
            shuffling_queue_capacity=shuffling_queue_capacity or 0,
        )
        if self._use_petastorm(options.shard_count):
            return petastorm_backend.loader(
                "tf", self.cache_dir_url, self.layout, options, prefetch
            )
        from sparkdist.data.tf_dataset import TFDatasetContext

        return TFDatasetContext(ShardReader(self.layout, options), prefetch)

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
