"""A small Keras model on digits, trained with `tf.distribute.MultiWorkerMirroredStrategy`.

The runner gives every rank a TF_CONFIG naming all the workers, so the strategy needs no
arguments. Every worker reads the whole dataset; the strategy shards it by batch.
"""

from __future__ import annotations

import os
import time


def train_digits_keras(epochs: int = 8, model_dir: str | None = None) -> dict:
    """Train with MultiWorkerMirroredStrategy; rank 0 saves the model (if `model_dir`)
    and returns the test accuracy, the number of replicas and the training time."""
    started = time.time()
    import tensorflow as tf

    from sparkdist.demos.digits import load_digits_split

    tf.keras.utils.set_random_seed(0)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank = int(os.environ.get("RANK", "0"))
    x_train, x_test, y_train, y_test = load_digits_split()
    train = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(2048, seed=0).batch(64)
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.Input(shape=(64,)),
                tf.keras.layers.Dense(128, activation="relu"),
                tf.keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=tf.keras.optimizers.Adam(0.01),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    # The dataset shuffles itself; Keras warns when also asked to (its default).
    history = model.fit(train, epochs=epochs, verbose=0, shuffle=False)
    predicted = model.predict(x_test, verbose=0).argmax(axis=1)
    saved = None
    if rank == 0 and model_dir:
        saved = os.path.join(model_dir, "digits.keras")
        model.save(saved)
    return {
        "accuracy": float((predicted == y_test).mean()),
        "ranks": strategy.num_replicas_in_sync,
        "loss": [float(v) for v in history.history["loss"]],
        "saved": saved,
        "train_seconds": time.time() - started,
    }
