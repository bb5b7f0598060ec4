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
from sparkdist.data.reader import Layout, ShardReader, default_shard
from sparkdist.data.transform import TransformSpec

if TYPE_CHECKING:
    from sparkdist.data.tf_dataset import TFDatasetContext
    from sparkdist.data.torch_loader import TorchLoaderContext

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "pyarrow", "petastorm")


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

    def _reader(
        self,
        *,
        shuffle: bool,
        shuffling_queue_capacity: int,
        shuffle_buffer_rows: int | None,
        transform_spec: Any,
        **kwargs: Any,
    ) -> ShardReader:
        if shuffling_queue_capacity:  # petastorm's knob: shuffle, mixing this many rows
            shuffle = True
            shuffle_buffer_rows = shuffle_buffer_rows or shuffling_queue_capacity
        return ShardReader(
            self.layout,
            shuffle=shuffle,
            shuffle_buffer_rows=shuffle_buffer_rows,
            transform=_our_transform(transform_spec),
            **kwargs,
        )

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
        cur_shard, shard_count = default_shard(cur_shard, shard_count)
        if self._use_petastorm(shard_count):
            return petastorm_backend.torch_context(
                self.cache_dir_url,
                self.layout,
                batch_size=batch_size,
                num_epochs=num_epochs,
                shuffle=shuffle or bool(shuffling_queue_capacity),
                seed=seed,
                shuffle_buffer_rows=shuffling_queue_capacity or shuffle_buffer_rows or 8192,
                cur_shard=cur_shard,
                shard_count=shard_count,
                columns=columns,
                workers_count=workers_count,
                transform_spec=transform_spec,
            )
        from sparkdist.data.torch_loader import TorchLoaderContext

        reader = self._reader(
            batch_size=batch_size,
            num_epochs=num_epochs,
            cur_shard=cur_shard,
            shard_count=shard_count,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            shuffle_buffer_rows=shuffle_buffer_rows,
            shuffling_queue_capacity=shuffling_queue_capacity,
            transform_spec=transform_spec,
            columns=columns,
            prefetch=prefetch,
            workers_count=workers_count,
            writable=True,
        )
        return TorchLoaderContext(
            reader,
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
        seed: int | None = None,
        drop_last: bool = False,
        shuffle_buffer_rows: int | None = None,
        shuffling_queue_capacity: int | None = None,
        transform_spec: Any = None,
        columns: Sequence[str] | None = None,
        prefetch: int | None = None,
        workers_count: int | None = None,
    ) -> TFDatasetContext | Any:
        """Context manager giving a ``tf.data.Dataset`` of namedtuple batches of this rank.

        ``batch_size=None`` means 32, as in petastorm; ``prefetch=None`` means AUTOTUNE.
        The other arguments and the guarantees (equal steps, global shuffle, position)
        are those of ``make_torch_dataloader``; ``dataset.steps_per_epoch`` is the number
        of batches per epoch on every rank, for Keras ``fit``.
        """
        batch_size = batch_size or 32
        cur_shard, shard_count = default_shard(cur_shard, shard_count)
        if self._use_petastorm(shard_count):
            return petastorm_backend.tf_context(
                self.cache_dir_url,
                self.layout,
                batch_size=batch_size,
                num_epochs=num_epochs,
                shuffle=shuffle or bool(shuffling_queue_capacity),
                seed=seed,
                shuffle_buffer_rows=shuffling_queue_capacity or shuffle_buffer_rows or 8192,
                cur_shard=cur_shard,
                shard_count=shard_count,
                columns=columns,
                workers_count=workers_count,
                prefetch=prefetch,
                transform_spec=transform_spec,
            )
        from sparkdist.data.tf_dataset import TFDatasetContext

        reader = self._reader(
            batch_size=batch_size,
            num_epochs=num_epochs,
            cur_shard=cur_shard,
            shard_count=shard_count,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            shuffle_buffer_rows=shuffle_buffer_rows,
            shuffling_queue_capacity=shuffling_queue_capacity or 0,
            transform_spec=transform_spec,
            columns=columns,
            workers_count=workers_count,
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


def _our_transform(spec: Any) -> TransformSpec | None:
    """A `TransformSpec`, also from petastorm's class of the same shape."""
    if spec is None or isinstance(spec, TransformSpec):
        return spec
    if all(hasattr(spec, name) for name in ("func", "edit_fields", "selected_fields")):
        return TransformSpec(
            spec.func, spec.edit_fields, getattr(spec, "removed_fields", None), spec.selected_fields
        )
    raise TypeError(f"transform_spec must be a sparkdist.data.TransformSpec, got {spec!r}")
