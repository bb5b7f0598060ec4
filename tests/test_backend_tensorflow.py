"""TensorFlow backend end to end: Keras `fit` under MultiWorkerMirroredStrategy on two
ranks placed by real Spark (local-cluster), with the TF_CONFIG sparkdist builds."""

from __future__ import annotations

import json

from installed import requires

from sparkdist import HorovodRunner
from sparkdist.backends.tensorflow import tf_config

pytestmark = requires("tensorflow", "pip install tensorflow-cpu (make venv)")


def keras_mwms_main(model_dir: str, epochs: int) -> dict:
    """Train a small Keras model on digits with MultiWorkerMirroredStrategy; rank 0 saves
    it (the others do not) and checks the saved copy."""
    import os

    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    tf.keras.utils.set_random_seed(0)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank = int(os.environ["RANK"])
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=0, stratify=y
    )
    train = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(2048, seed=0).batch(64)
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.Input(shape=(64,)),
                tf.keras.layers.Dense(64, activation="relu"),
                tf.keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=tf.keras.optimizers.Adam(0.01),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    history = model.fit(train, epochs=epochs, verbose=0)
    result = {
        "history": history.history,
        "replicas": strategy.num_replicas_in_sync,
        "tf_config": json.loads(os.environ["TF_CONFIG"]),
        "saved": None,
    }
    if rank == 0:
        path = os.path.join(model_dir, "model.keras")
        model.save(path)
        restored = tf.keras.models.load_model(path)
        predicted = restored.predict(x_test, verbose=0).argmax(axis=1)
        result["saved"] = {"path": path, "test_accuracy": float((predicted == y_test).mean())}
    return result


def test_keras_fit_multi_worker_mirrored_np2(sc, tmp_path):
    runner = HorovodRunner(np=2, start_timeout=180, timeout=300)
    result = runner.run(keras_mwms_main, model_dir=str(tmp_path), epochs=5)

    assert result["replicas"] == 2
    workers = result["tf_config"]["cluster"]["worker"]
    assert len(workers) == 2 and len(set(workers)) == 2
    assert all(w.startswith("127.0.0.1:") for w in workers)
    assert result["tf_config"]["task"] == {"type": "worker", "index": 0}
    history = result["history"]
    assert len(history["loss"]) == 5
    assert history["loss"][-1] < history["loss"][0]
    assert history["accuracy"][-1] > 0.9
    # Only rank 0 saved, and what it saved is the trained model.
    assert [p.name for p in tmp_path.iterdir()] == ["model.keras"]
    assert result["saved"]["test_accuracy"] > 0.9


def test_tf_config_shape():
    assert tf_config(["h:1", "h:2"], 1) == {
        "cluster": {"worker": ["h:1", "h:2"]},
        "task": {"type": "worker", "index": 1},
    }
    json.dumps(tf_config(["h:1"], 0))
