"""TensorFlow checkpoints on shared storage with the same contract as sharded torch ones:
written by the ranks to `checkpoint_dir`, committed to the driver by rank 0 once down,
resumed from the newest commit.

    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer)
    manager = checkpoint.tf_manager(ckpt)
    found = manager.restore()          # Resume(step, ckpt, world_size) or None
    for epoch in range(found.step if found else 0, epochs):
        ...
        manager.save(step=epoch + 1)   # on every rank that runs main

MultiWorkerMirroredStrategy: every worker must save (reading mirrored variables may run
collectives); the chief (rank 0) writes with `tf.train.CheckpointManager` into the
step's directory, the other workers into temporary directories beside it, as TensorFlow
requires, which they remove once written; the chief commits only when every worker says
its write is done (a crash's leftovers go with the next commit).
ParameterServerStrategy: only the chief runs `main`; it saves, reading the variables
from the parameter servers. Each step is its own directory, so a crash mid-save never
touches a committed one.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from sparkdist.checkpoint.rank.driver_record import Resize, Resume, client, commit, place, rank
from sparkdist.protocol import messages

logger = logging.getLogger(__name__)

KIND = "tf-checkpoint"


SAVE_TIMEOUT_S = 600.0
"""How long the chief waits for the other workers' writes before giving up the save."""


def _savers() -> int:
    """How many ranks run `main` and save: every worker under MultiWorkerMirroredStrategy,
    the chief alone in a parameter-server cluster (its workers and ps run servers)."""
    cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    if "chief" in cluster or "ps" in cluster:
        return 1
    return len(cluster.get("worker", [])) or 1


class TFCheckpoints:
    """Save and restore a `tf.train.Checkpoint` through the driver's commit record."""

    def __init__(self, checkpoint: Any):
        import tensorflow as tf

        if not isinstance(checkpoint, tf.train.Checkpoint):
            raise TypeError(
                f"tf_manager takes a tf.train.Checkpoint (e.g. tf.train.Checkpoint("
                f"model=model, optimizer=optimizer)), got {type(checkpoint).__name__}"
            )
        self.checkpoint = checkpoint

    def save(self, step: int) -> str:
        """Write the checkpoint of `step`; on rank 0, commit it. Returns where it is."""
        import tensorflow as tf

        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an int >= 0 (e.g. the epochs done), got {step!r}")
        chief = rank() == 0
        directory = place(step) if chief else place(step, f"tmp{rank()}")
        manager = tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=1)
        manager.save(checkpoint_number=step)  # the `checkpoint` index file is written last
        barrier = f"sparkdist-tf-checkpoint-{step}"
        if not chief:
            client().put(f"{barrier}-{rank()}", True)  # written: the chief may commit
            try:
                tf.io.gfile.rmtree(directory)
            except tf.errors.OpError:
                pass  # already removed by a later commit
            return directory
        for worker in range(1, _savers()):
            client().get(f"{barrier}-{worker}", SAVE_TIMEOUT_S)
        if commit(step, directory, KIND) == "grow":
            raise Resize(step)
        return directory

    def restore(self):
        """Restore the newest committed checkpoint into the checkpoint's objects; its
        `Resume` (step, this tf.train.Checkpoint, world size), or None."""
        import tensorflow as tf

        reply = client().request(messages.CheckpointLatest())
        if reply.value is None:
            return None
        step, record = reply.value
        try:
            if not isinstance(record, dict) or record.get("kind") != KIND:
                raise ValueError(
                    f"the newest checkpoint (step {step}) was not saved by tf_manager: "
                    "resume it with sparkdist.checkpoint.resume()"
                )
            path = tf.train.latest_checkpoint(record["location"])
            if path is None:
                raise FileNotFoundError(f"no TensorFlow checkpoint in {record['location']}")
            self.checkpoint.restore(path)
        finally:
            client().request(messages.CheckpointLoaded())
        logger.info("restored checkpoint %d from %s", step, path)
        return Resume(step, self.checkpoint, record["world_size"])
