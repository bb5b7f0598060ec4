"""TensorFlow checkpoints on shared storage (`sparkdist.checkpoint.tf_manager`) with real
TensorFlow ranks on real Spark: MultiWorkerMirroredStrategy on two ranks (the chief
writes the step's directory, the other worker a temporary one that is removed), a
relaunched job restoring what was committed, and a ParameterServerStrategy chief saving
variables that live on a parameter server."""

from __future__ import annotations

import json
from pathlib import Path

from installed import requires

import sparkdist

pytestmark = requires("tensorflow", "pip install tensorflow-cpu (make venv)")


def mwms_main(steps: int) -> dict:
    """Mirrored variables `steps` steps further than the newest committed checkpoint."""
    import os

    import tensorflow as tf

    from sparkdist import checkpoint

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        weights = tf.Variable(tf.zeros([4]), name="weights")
        done = tf.Variable(0, dtype=tf.int64, name="done")
    manager = checkpoint.tf_manager(tf.train.Checkpoint(weights=weights, done=done))
    found = manager.restore()
    restored = weights.numpy().tolist()
    start = found.step if found else 0
    for step in range(start + 1, start + steps + 1):
        weights.assign_add(tf.fill([4], float(step)))
        done.assign(step)
        where = manager.save(step)
    return {
        "rank": int(os.environ["RANK"]),
        "restored": restored,
        "resumed": None if found is None else (found.step, found.world_size),
        "weights": weights.numpy().tolist(),
        "where": where,
    }


def test_multi_worker_mirrored_saves_and_a_new_job_restores(sc, tmp_path):
    store = tmp_path / "store"
    runner = sparkdist.HorovodRunner(np=2, checkpoint_dir=str(store), timeout=300)
    first = runner.run_all(mwms_main, steps=2)
    assert [r["resumed"] for r in first] == [None, None]
    assert first[0]["weights"] == first[1]["weights"] == [3.0] * 4
    sharded = store / "sharded"
    # The chief's directories are the committed ones; the worker's temporary ones are gone.
    records = [json.loads(p.read_text()) for p in sorted(store.glob("*.commit.json"))]
    assert [(r["step"], r["world_size"], r["kind"]) for r in records] == [
        (1, 2, "tf-checkpoint"),
        (2, 2, "tf-checkpoint"),
    ]
    assert sorted(p.name for p in sharded.iterdir()) == sorted(r["name"] for r in records)
    assert (Path(first[0]["where"]) / "ckpt-2.index").is_file()
    assert not Path(first[1]["where"]).exists()

    second = runner.run_all(mwms_main, steps=1)
    for result in second:
        assert result["resumed"] == (2, 2) and result["restored"] == [3.0] * 4
        assert result["weights"] == [6.0] * 4


def ps_chief_main() -> dict:
    """The chief of a parameter-server job: restore, add 1 to variables on the ps, save."""
    import tensorflow as tf

    from sparkdist import checkpoint

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    with strategy.scope():
        weights = tf.Variable(tf.zeros([3]), name="weights")
    manager = checkpoint.tf_manager(tf.train.Checkpoint(weights=weights))
    found = manager.restore()
    step = (found.step if found else 0) + 1
    weights.assign_add(tf.ones([3]))
    manager.save(step)
    return {"step": step, "weights": weights.numpy().tolist(), "device": weights.device}


def test_parameter_server_chief_saves_and_restores(sc, tmp_path):
    store = tmp_path / "store"
    runner = sparkdist.HorovodRunner(
        np=-3, roles={"chief": 1, "worker": 1, "ps": 1}, checkpoint_dir=str(store), timeout=200
    )
    first = runner.run(ps_chief_main)
    assert first["step"] == 1 and first["weights"] == [1.0] * 3
    assert "/job:ps" in first["device"]
    second = runner.run(ps_chief_main)
    assert second["step"] == 2 and second["weights"] == [2.0] * 3
