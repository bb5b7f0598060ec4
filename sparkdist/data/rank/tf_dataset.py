"""The TensorFlow side: a ``tf.data.Dataset`` of namedtuple batches, like petastorm's.

Each element is a namedtuple with one field per column (``batch.features``,
``batch.label``), each a batched tensor; arrays come out as ``(batch, length)``. For Keras,
map it to a tuple: ``dataset.map(lambda b: (b.features, b.label))``. Every rank gets the
same number of batches per epoch (``dataset.steps_per_epoch``, for Keras ``fit``), and
``dataset.state_dict()`` / ``dataset.load_state_dict()`` carry the position as on the
torch side. tf.data takes batches ahead of the training step (its prefetch, Keras's own
buffers), so ``dataset.state_dict(steps=n)`` gives the exact place after the first ``n``
batches of the current iteration, the steps the model trained on. An iteration that tf
drops before its end does not move the position (tf.distribute takes a few batches to look
at a dataset before Keras trains on it): the next one starts where it did. It is a
``tf.compat.v1`` dataset, so TF1 code in graph mode (``make_one_shot_iterator()``, a
``Session``) reads it as it read petastorm's.
"""

from __future__ import annotations

import collections
import keyword
from typing import Any

from sparkdist.data.layout import ColumnInfo
from sparkdist.data.rank.reader import ShardReader


def _spec(info: ColumnInfo) -> Any:
    import numpy as np
    import tensorflow as tf

    if info.kind in ("string", "binary"):
        return tf.TensorSpec(shape=(None,), dtype=tf.string)
    dtype = tf.as_dtype(np.dtype(info.dtype))
    if info.kind == "array":
        return tf.TensorSpec(shape=(None, *(info.shape or (info.length,))), dtype=dtype)
    return tf.TensorSpec(shape=(None,), dtype=dtype)


def check_names(reader: ShardReader) -> None:
    """Refuse, when asked for the dataset, columns that cannot be namedtuple fields."""
    names = [info.name for info in reader.batch_columns]
    bad = [n for n in names if not n.isidentifier() or keyword.iskeyword(n) or n[:1] == "_"]
    if bad:
        raise ValueError(
            f"make_tf_dataset yields namedtuples, so column names must be Python "
            f"identifiers not starting with '_'; rename {bad} (df.withColumnRenamed) or "
            f"choose columns with columns=[...]"
        )


def make_dataset(reader: ShardReader, prefetch: int | None) -> Any:
    """The rank's ``tf.data`` dataset; a ``tf.compat.v1`` one, so TF1 code's
    ``dataset.make_one_shot_iterator()`` works as with petastorm (it is a TF2 dataset too)."""
    import tensorflow as tf

    names = [info.name for info in reader.batch_columns]
    batch_type = collections.namedtuple("Batch", names)  # type: ignore[misc]
    signature = batch_type(*[_spec(info) for info in reader.batch_columns])

    def generate():
        for batch in reader.iteration_apart():
            yield batch_type(*[batch[name] for name in names])

    dataset = tf.compat.v1.data.Dataset.from_generator(generate, output_signature=signature)
    prefetch = tf.data.AUTOTUNE if prefetch is None else prefetch
    dataset = dataset.prefetch(prefetch) if prefetch else dataset
    # Already this rank's slice: tf.distribute must not shard it again (its AUTO
    # policy would give each worker every n-th batch of it).
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset = dataset.with_options(options)
    dataset.steps_per_epoch = reader.batches_per_epoch()
    dataset.state_dict = reader.state_dict
    dataset.load_state_dict = reader.load_state_dict
    dataset.on_world_change = reader.on_world_change
    return dataset
