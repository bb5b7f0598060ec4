"""Reading through petastorm when asked for (``backend="petastorm"``, Spark 3.5 stacks).

Only the reading is delegated: sparkdist writes and caches the Parquet itself, then hands
petastorm's own ``SparkDatasetConverter`` the file list, so both backends share one cache
and one ``len()``. petastorm shards by whole row groups, so it is used only when the data
has at least as many row groups as shards; otherwise the pyarrow reader takes over.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

from sparkdist.data.reader import Layout


@functools.lru_cache(maxsize=1)
def petastorm_status() -> tuple[str | None, str]:
    """(petastorm's version, "") when it imports here, else (None, why not)."""
    try:
        import petastorm
        from petastorm import make_batch_reader  # noqa: F401
        from petastorm.spark import SparkDatasetConverter  # noqa: F401
    except Exception as error:  # ImportError, or a binary mismatch with pyarrow/numpy
        reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return None, f"{type(error).__name__}: {reason}" if reason else type(error).__name__
    return str(getattr(petastorm, "__version__", "unknown")), ""


def _converter(cache_dir_url: str, layout: Layout) -> Any:
    from petastorm.spark import SparkDatasetConverter

    return SparkDatasetConverter(cache_dir_url, list(layout.file_urls), layout.num_rows)


def _reader_kwargs(
    *,
    cur_shard: int,
    shard_count: int,
    shuffle: bool,
    seed: int | None,
    columns: Sequence[str] | None,
    transform_spec: Any = None,
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"shuffle_row_groups": shuffle, "seed": seed}
    if transform_spec is not None:
        from petastorm import TransformSpec

        kwargs["transform_spec"] = TransformSpec(
            transform_spec.func,
            edit_fields=transform_spec.edit_fields,
            removed_fields=transform_spec.removed_fields,
            selected_fields=transform_spec.selected_fields,
        )
    if shard_count > 1:
        kwargs.update(cur_shard=cur_shard, shard_count=shard_count)
    if columns is not None:
        # petastorm matches schema_fields as regular expressions.
        kwargs["schema_fields"] = [f"^{re.escape(name)}$" for name in columns]
    return kwargs


def torch_context(
    cache_dir_url: str,
    layout: Layout,
    *,
    batch_size: int,
    num_epochs: int | None,
    shuffle: bool,
    seed: int | None,
    shuffle_buffer_rows: int,
    cur_shard: int,
    shard_count: int,
    columns: Sequence[str] | None,
    workers_count: int | None,
    transform_spec: Any = None,
) -> Any:
    """petastorm's ``make_torch_dataloader`` context manager (dicts of tensors)."""
    return _converter(cache_dir_url, layout).make_torch_dataloader(
        batch_size=batch_size,
        num_epochs=num_epochs,
        workers_count=workers_count,
        shuffling_queue_capacity=shuffle_buffer_rows if shuffle else 0,
        **_reader_kwargs(
            cur_shard=cur_shard,
            shard_count=shard_count,
            shuffle=shuffle,
            seed=seed,
            columns=columns,
            transform_spec=transform_spec,
        ),
    )


def tf_context(
    cache_dir_url: str,
    layout: Layout,
    *,
    batch_size: int,
    num_epochs: int | None,
    shuffle: bool,
    seed: int | None,
    shuffle_buffer_rows: int,
    cur_shard: int,
    shard_count: int,
    columns: Sequence[str] | None,
    workers_count: int | None,
    prefetch: int | None,
    transform_spec: Any = None,
) -> Any:
    """petastorm's ``make_tf_dataset`` context manager (namedtuple batches)."""
    return _converter(cache_dir_url, layout).make_tf_dataset(
        batch_size=batch_size,
        prefetch=prefetch,
        num_epochs=num_epochs,
        workers_count=workers_count,
        shuffling_queue_capacity=shuffle_buffer_rows if shuffle else None,
        **_reader_kwargs(
            cur_shard=cur_shard,
            shard_count=shard_count,
            shuffle=shuffle,
            seed=seed,
            columns=columns,
            transform_spec=transform_spec,
        ),
    )
