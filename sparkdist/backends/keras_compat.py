"""Keras 3 `Model.fit` under MultiWorkerMirroredStrategy with more than one worker.

Why: Keras 3's TensorFlow trainer (TensorFlow 2.16+) fails on the first step of `fit`
as soon as the strategy spans two workers (keras-team/keras#20585, open as of Keras
3.15), in two places, both only on the multi-worker path:

* `TensorFlowTrainer._maybe_symbolic_build` passes the whole (x, y) batch, a nest of
  PerReplica values, to `strategy.reduce`, which takes one value ("Attempt to convert a
  value (PerReplica...) to a Tensor");
* `reduce_per_replica` reduces every step output with `strategy.reduce("MEAN", v,
  axis=0)`, also scalars such as the loss ("Invalid reduction dimension 0 for input
  with 0 dimensions").

Here the first uses one local replica's batch (the symbolic build needs only shapes and
dtypes), and the second reduces scalars across replicas with `axis=None`; everything
else is left to Keras. The patch is applied, in ranks of multi-worker TensorFlow jobs
only, when Keras imports its TensorFlow trainer (an import hook, so jobs that never
import Keras pay nothing), and only if that module has the shape it was written for.
Set SPARKDIST_KERAS_MULTIWORKER_FIX=0 to leave Keras untouched.
"""

from __future__ import annotations

import logging
from types import ModuleType

from sparkdist.backends.import_hooks import after_import
from sparkdist.job_environment import KERAS_MULTIWORKER_FIX as DISABLE_ENV

logger = logging.getLogger(__name__)

TRAINER_MODULE = "keras.src.backend.tensorflow.trainer"
_PATCHED = "_sparkdist_multiworker_fix"


def patch_trainer(trainer: ModuleType) -> bool:
    """Patch Keras's TensorFlow trainer module in place; False if it is not the shape
    this fix was written for (then nothing is changed)."""
    cls = getattr(trainer, "TensorFlowTrainer", None)
    original_build = getattr(cls, "_maybe_symbolic_build", None)
    original_reduce = getattr(trainer, "reduce_per_replica", None)
    is_multi_worker = getattr(trainer, "_collective_all_reduce_multi_worker", None)
    if None in (cls, original_build, original_reduce, is_multi_worker):
        logger.debug("Keras trainer has an unknown shape; multi-worker fix not applied")
        return False
    if getattr(trainer, _PATCHED, False):
        return True
    import tensorflow as tf
    from keras.src import tree

    def first_local(strategy, value):
        if isinstance(value, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(value)[0]
        return value

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        if iterator is None or strategy is None or not is_multi_worker(strategy):
            return original_build(self, iterator=iterator, data_batch=data_batch)
        for _, _, it in iterator:
            batch = next(it)
            data_batch = tree.map_structure(lambda v: first_local(strategy, v), batch)
            break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    def reduce_per_replica(values, strategy, reduction):
        if reduction not in ("auto", "mean") or not is_multi_worker(strategy):
            return original_reduce(values, strategy, reduction)

        def mean(value):
            axis = 0 if first_local(strategy, value).shape.rank else None
            return strategy.reduce("MEAN", value, axis=axis)

        return tree.map_structure(mean, values)

    cls._maybe_symbolic_build = _maybe_symbolic_build
    trainer.reduce_per_replica = reduce_per_replica
    setattr(trainer, _PATCHED, True)
    logger.debug("patched Keras's TensorFlow trainer for multi-worker fit")
    return True


def _patch_quietly(trainer: ModuleType) -> None:
    try:
        patch_trainer(trainer)
    except Exception:  # noqa: BLE001 - a failed fix must not break Keras's import
        logger.warning("could not patch Keras for multi-worker fit", exc_info=True)


def install(env) -> None:
    """Fix Keras's multi-worker `fit` in this process, now or when Keras is imported."""
    if env.get(DISABLE_ENV, "1") != "0":
        after_import(TRAINER_MODULE, _patch_quietly)
