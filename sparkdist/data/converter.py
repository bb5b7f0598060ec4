"""``SparkDatasetConverter``: the handle ``make_spark_converter`` returns, and its loaders.

The shape is petastorm's (``make_torch_dataloader``, ``make_tf_dataset``, ``len()``,
``delete()``) so code written for it carries over. The handle holds only URLs and row
counts: it is small and cloudpicklable, so the runner can ship it to the ranks, where each
one opens its own shard (by default the one named by env RANK / WORLD_SIZE). How a
DataFrame becomes one is `sparkdist.data.driver.convert`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from sparkdist.data import cache, petastorm_backend
from sparkdist.data.layout import Layout
from sparkdist.data.rank.reader import ReaderContext, ReaderPosition, ReadOptions, ShardReader

logger = logging.getLogger(__name__)

READER_POOL_TYPES = ("thread", "process", "dummy")


@dataclass(frozen=True)
class SparkDatasetConverter:
    """A DataFrame's rows as Parquet files; makes PyTorch loaders and tf.data datasets.

    Picklable and small (URLs and row counts), so it can travel to the ranks.
    ``cache_dir_url`` is the copy's directory, or None when the ranks read the source's
    own files (``source`` "parquet" or "delta"; "copy" otherwise). ``tensor_types`` is
    what the torch loader gives: "petastorm" (booleans as torch.uint8) or "torch".
    """

    # petastorm's constant, for code written against it: our conf name (petastorm's own
    # name, "petastorm.spark.converter.parentCacheDirUrl", is honoured too).
    PARENT_CACHE_DIR_URL_CONF: ClassVar[str] = cache.CACHE_DIR_CONF

    cache_dir_url: str | None
    layout: Layout
    backend: str = "pyarrow"
    dtype: str | None = "float32"
    source: str = "copy"
    tensor_types: str = "petastorm"

    def __len__(self) -> int:
        return self.layout.num_rows

    @property
    def dataset_size(self) -> int:
        """Rows in the whole dataset (petastorm's name for ``len()``)."""
        return self.layout.num_rows

    @property
    def file_urls(self) -> list[str]:
        return list(self.layout.file_urls)

    def _use_petastorm(self, options: ReadOptions) -> bool:
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
        if (
            options.pad_column is not None
            or options.global_batch_size is not None
            or options.features is not None
        ):
            logger.info(
                "sparkdist.data: petastorm marks no pads, has no global batch and stacks no "
                "features, so the pyarrow reader reads"
            )
            return False
        if self.layout.num_row_groups < options.shard_count:
            logger.info(
                "sparkdist.data: %d row groups for %d shards: petastorm shards by row group, "
                "so the pyarrow reader (row ranges) reads this one",
                self.layout.num_row_groups,
                options.shard_count,
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
        pad_column: str | None = None,
        global_batch_size: int | None = None,
        weight_column: str = "row_weight",
        rank_split: str = "contiguous",
        features: Mapping[str, Sequence[str] | str] | None = None,
        shuffle_buffer_rows: int | None = None,
        shuffling_queue_capacity: int = 0,
        transform_spec: Any = None,
        columns: Sequence[str] | None = None,
        prefetch: int = 2,
        workers_count: int | None = None,
        reader_pool_type: str = "thread",
        data_loader_fn: Callable[..., Any] | None = None,
        collate_fn: Callable[[dict], Any] | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        device: Any = None,
        **dataloader_kwargs: Any,
    ) -> ReaderContext | Any:
        """Context manager giving a ``torch.utils.data.DataLoader`` of this rank's batches.

        Batches are ``{column: tensor}`` (or what ``collate_fn`` makes of a ``{column: numpy
        array}`` batch), of the converter's ``tensor_types``. Rank ``cur_shard`` of ``shard_count``
        (default: this rank, from env RANK / WORLD_SIZE, Horovod's or MPI's, else all the data)
        reads its equal slice of each epoch's global order: every rank gets the same number of
        batches (padded, or ``drop_last``); ``pad_column="is_pad"`` marks the padded rows in each
        batch. ``global_batch_size=G``: G rows a step for the world, whatever its size, each row
        weighted in ``weight_column`` (docs/data.md, "A global batch"); ``rank_split="per_step"``:
        step ``s`` reads the same G rows in any world (docs/data.md, "The same steps in any world").
        ``features={"x": ["f0", ..., "f63"]}`` (or a pattern, ``r"f\\d+"``) stacks those columns
        into one ``[batch, 64]`` tensor ``x`` as the rows are decoded (docs/data.md, "Wide tables").
        ``shuffle`` (or petastorm's ``shuffling_queue_capacity``) draws a new global order each
        epoch from ``seed`` (the same on every rank, default 0). Each iteration reads ``num_epochs``
        epochs (None: forever) from the loader's position, which ``state_dict()`` /
        ``load_state_dict()`` save and restore. ``transform_spec`` is a `TransformSpec`;
        ``workers_count`` threads decode side by side (default: the rank's share of the cores); a
        thread reads ``prefetch`` decoded chunks ahead (0: none); ``num_workers`` / ``pin_memory`` /
        other keywords go to DataLoader. ``data_loader_fn`` makes the loader instead, called as
        petastorm calls it (``reader=``, ``batch_size=``, ``shuffling_queue_capacity=``; default:
        `BatchedDataLoader`). ``device``: batches handed out there (`rank.device_feed`).
        """
        options = ReadOptions.of(locals(), writable=True, **_pool(reader_pool_type))
        _check_device(device, data_loader_fn, self._use_petastorm(options))
        if self._use_petastorm(options):
            return petastorm_backend.loader("torch", self.cache_dir_url, self.layout, options)
        given = {"collate_fn": collate_fn, "num_workers": num_workers, "pin_memory": pin_memory}
        given["device"] = device
        sizes = {"batch_size": batch_size, "shuffling_queue_capacity": shuffling_queue_capacity}
        make = _loader_maker(data_loader_fn, self.tensor_types, sizes, given, dataloader_kwargs)
        return ReaderContext(self.layout, options, make)

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
        pad_column: str | None = None,
        global_batch_size: int | None = None,
        weight_column: str = "row_weight",
        rank_split: str = "contiguous",
        features: Mapping[str, Sequence[str] | str] | None = None,
        shuffle_buffer_rows: int | None = None,
        shuffling_queue_capacity: int | None = None,
        transform_spec: Any = None,
        columns: Sequence[str] | None = None,
        workers_count: int | None = None,
        reader_pool_type: str = "thread",
    ) -> ReaderContext | Any:
        """Context manager giving a ``tf.data.Dataset`` of namedtuple batches of this rank.

        A ``tf.compat.v1`` dataset, as petastorm's (TF1's ``make_one_shot_iterator()``
        works). ``batch_size=None`` means 32, as in petastorm; ``prefetch=None`` means
        AUTOTUNE. The other arguments and the guarantees (equal steps, global shuffle,
        position, ``pad_column``, ``global_batch_size`` and ``rank_split``) are those of
        ``make_torch_dataloader``; ``dataset.steps_per_epoch`` is the number of batches per
        epoch on every rank, for Keras ``fit``.
        """
        options = ReadOptions.of(
            locals(),
            skip=["prefetch"],
            batch_size=batch_size or 32,
            shuffling_queue_capacity=shuffling_queue_capacity or 0,
            **_pool(reader_pool_type),
        )
        if self._use_petastorm(options):
            return petastorm_backend.loader(
                "tf", self.cache_dir_url, self.layout, options, prefetch
            )
        from sparkdist.data.rank import tf_dataset

        context = ReaderContext(
            self.layout, options, functools.partial(tf_dataset.make_dataset, prefetch=prefetch)
        )
        tf_dataset.check_names(context.reader)
        return context

    def make_numpy_batches(
        self,
        batch_size: int = 32,
        *,
        num_epochs: int | None = None,
        shuffle: bool = False,
        seed: int | None = None,
        drop_last: bool = False,
        pad_column: str | None = None,
        global_batch_size: int | None = None,
        weight_column: str = "row_weight",
        rank_split: str = "contiguous",
        features: Mapping[str, Sequence[str] | str] | None = None,
        cur_shard: int | None = None,
        shard_count: int | None = None,
        columns: Sequence[str] | None = None,
        transform_spec: Any = None,
        shuffle_buffer_rows: int | None = None,
        prefetch: int = 2,
        workers_count: int | None = None,
        reader_pool_type: str = "thread",
    ) -> ReaderContext:
        """Context manager giving this rank's batches as ``{column: numpy array}``.

        Neither torch nor TensorFlow is imported: for JAX, scikit-learn or plain numpy.
        The arguments and the guarantees (equal steps, global shuffle, the position with
        ``len()``, ``epoch``, ``state_dict()`` / ``load_state_dict()``, ``pad_column``,
        ``global_batch_size`` and ``rank_split``) are those of ``make_torch_dataloader``;
        the arrays are the caller's to write to. A new API, so every argument but
        ``batch_size`` is given by keyword.
        """
        options = ReadOptions.of(locals(), writable=True, **_pool(reader_pool_type))
        return ReaderContext(self.layout, options, NumpyBatches)

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


def _pool(reader_pool_type: str) -> dict[str, Any]:
    """petastorm's ``reader_pool_type`` as reading options: "dummy" reads in the caller's
    thread; "thread" decodes in the reader's threads; "process" in ``workers_count``
    processes beside the rank's (`sparkdist.data.rank.decode_processes`)."""
    if reader_pool_type not in READER_POOL_TYPES:
        raise ValueError(
            f"reader_pool_type must be one of {READER_POOL_TYPES}, not {reader_pool_type!r}"
        )
    if reader_pool_type == "dummy":
        return {"prefetch": 0, "workers_count": 1}
    return {"decode_processes": reader_pool_type == "process"}


def _check_device(device: Any, data_loader_fn: Any, petastorm: bool) -> None:
    """``device=`` needs sparkdist's own loader."""
    if device is not None and (data_loader_fn is not None or petastorm):
        raise ValueError(
            "device= is for sparkdist's own loader, not petastorm's or a data_loader_fn's: "
            "wrap that loader in sparkdist.data.rank.device_prefetch.DevicePrefetcher"
        )


def _loader_maker(
    data_loader_fn: Callable[..., Any] | None,
    tensor_types: Any,
    sizes: dict[str, Any],
    given: dict[str, Any],
    dataloader_kwargs: dict[str, Any],
) -> Callable[..., Any]:
    """What makes the torch DataLoader once the reader exists: `data_loader_fn` (default
    `BatchedDataLoader`) with the sizes, the DataLoader options that were set, and any
    other keywords."""
    from sparkdist.data.rank.torch_loader import BatchedDataLoader

    fn = data_loader_fn or functools.partial(BatchedDataLoader, tensor_types=tensor_types)
    extra = {name: value for name, value in given.items() if value} | dataloader_kwargs
    return functools.partial(fn, **sizes, **extra)


class NumpyBatches(ReaderPosition):
    """`make_numpy_batches`' loader: one rank's batches as ``{column: numpy array}``, with
    the torch loader's ``len()``, ``epoch`` and position; neither torch nor TF is imported."""

    def __init__(self, reader: ShardReader) -> None:
        self.reader = reader

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return iter(self.reader)
