"""Reading through petastorm when asked for (``backend="petastorm"``, Spark 3.5 stacks).

Only the reading is delegated: sparkdist writes and caches the Parquet itself, then hands
petastorm's own ``SparkDatasetConverter`` the file list, so both backends share one cache
and one ``len()``. petastorm shards by whole row groups, so it is used only when the data
has at least as many row groups as shards; otherwise the pyarrow reader takes over.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from sparkdist.data.layout import Layout
from sparkdist.data.rank.reader import ReadOptions


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


def _reader_kwargs(options: ReadOptions) -> dict[str, Any]:
    """petastorm's reader arguments for ``options`` (beside those its two loaders name)."""
    kwargs: dict[str, Any] = {"shuffle_row_groups": options.shuffled, "seed": options.seed}
    spec = options.transform_spec
    if spec is not None:
        from petastorm import TransformSpec

        kwargs["transform_spec"] = TransformSpec(
            spec.func,
            edit_fields=spec.edit_fields,
            removed_fields=spec.removed_fields,
            selected_fields=spec.selected_fields,
        )
    if options.shard_count > 1:
        kwargs.update(cur_shard=options.cur_shard, shard_count=options.shard_count)
    if options.columns is not None:
        # petastorm matches schema_fields as regular expressions.
        kwargs["schema_fields"] = [f"^{re.escape(name)}$" for name in options.columns]
    return kwargs


def loader(
    kind: str,
    cache_dir_url: str,
    layout: Layout,
    options: ReadOptions,
    prefetch: int | None = None,
) -> Any:
    """petastorm's context manager: ``make_torch_dataloader`` (dicts of tensors) for
    ``kind`` "torch", ``make_tf_dataset`` (namedtuple batches, tf.data's ``prefetch``)
    for "tf"."""
    # petastorm's own knob decides the buffer first, then ours.
    buffer = options.shuffling_queue_capacity or options.shuffle_buffer_rows or 8192
    kwargs = {
        "batch_size": options.batch_size,
        "num_epochs": options.num_epochs,
        "workers_count": options.workers_count,
        **_reader_kwargs(options),
    }
    converter = _converter(cache_dir_url, layout)
    if kind == "torch":
        capacity = buffer if options.shuffled else 0
        return converter.make_torch_dataloader(shuffling_queue_capacity=capacity, **kwargs)
    capacity = buffer if options.shuffled else None
    return converter.make_tf_dataset(prefetch=prefetch, shuffling_queue_capacity=capacity, **kwargs)
