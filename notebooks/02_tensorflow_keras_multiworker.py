# Databricks notebook source
# MAGIC %md
# MAGIC # 2. TensorFlow Keras with MultiWorkerMirroredStrategy
# MAGIC
# MAGIC Horovod's TensorFlow binding does not work with TensorFlow 2.16 and later (Keras 3), so
# MAGIC TensorFlow models train with TensorFlow's own `MultiWorkerMirroredStrategy`, under the
# MAGIC same `HorovodRunner`. The runner gives every rank a `TF_CONFIG` that names all the
# MAGIC workers, so the strategy needs no arguments: build and compile the model inside
# MAGIC `strategy.scope()`, then `fit` as usual.
# MAGIC
# MAGIC Locally this notebook starts an embedded Spark with two executors.

# COMMAND ----------

import os
import tempfile

try:
    spark  # noqa: B018 - the notebook's SparkSession, on Databricks
except NameError:
    from sparkdist.spark.session import embedded_spark

    spark = embedded_spark(executors=2)

ON_DATABRICKS = "DATABRICKS_RUNTIME_VERSION" in os.environ
try:
    OUTPUT_DIR  # noqa: B018 - set by whoever runs this notebook (the tests do)
except NameError:
    OUTPUT_DIR = (
        "/dbfs/tmp/sparkdist/02_keras" if ON_DATABRICKS else tempfile.mkdtemp(prefix="sparkdist-")
    )
os.makedirs(OUTPUT_DIR, exist_ok=True)

# COMMAND ----------

# MAGIC %md
# MAGIC ## The training function
# MAGIC
# MAGIC Every worker builds the same `tf.data` pipeline; the strategy splits each global batch
# MAGIC across the workers (so a global batch of 64 is 32 per worker on 2 ranks) and averages
# MAGIC the gradients. Only rank 0 (worker 0, the "chief") saves the model.

# COMMAND ----------


def train_keras(epochs=6, global_batch_size=64, model_dir=None):
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    tf.keras.utils.set_random_seed(0)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # reads TF_CONFIG
    rank = int(os.environ["RANK"])

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=0, stratify=y
    )
    train = (
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        .shuffle(2048, seed=0)
        .batch(global_batch_size)
    )
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
    history = model.fit(train, epochs=epochs, verbose=0)
    if rank == 0:
        losses = [round(v, 4) for v in history.history["loss"]]
        print(f"worker 0 of {strategy.num_replicas_in_sync}: loss per epoch {losses}")
        if model_dir:
            model.save(os.path.join(model_dir, "digits.keras"))
    return {
        "replicas": strategy.num_replicas_in_sync,
        "loss": [float(v) for v in history.history["loss"]],
        "train_accuracy": float(history.history["accuracy"][-1]),
    }


# COMMAND ----------

# MAGIC %md
# MAGIC ## Run it on two ranks
# MAGIC
# MAGIC `TF_CPP_MIN_LOG_LEVEL=2` keeps TensorFlow's C++ start-up chatter out of the output.

# COMMAND ----------

from sparkdist import HorovodRunner

runner = HorovodRunner(np=2, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
keras_result = runner.run(train_keras, epochs=6, model_dir=OUTPUT_DIR)
print(
    f"{keras_result['replicas']} replicas in sync, final training accuracy "
    f"{keras_result['train_accuracy']:.4f}, {runner.last_job.wall_time_s:.1f}s"
)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Load the model rank 0 saved and evaluate it on the driver

# COMMAND ----------

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

x, y = load_digits(return_X_y=True)
_, x_test, _, y_test = train_test_split(
    (x / 16.0).astype(np.float32), y, test_size=0.2, random_state=0, stratify=y
)
model = tf.keras.models.load_model(os.path.join(OUTPUT_DIR, "digits.keras"))
keras_test_accuracy = float((model.predict(x_test, verbose=0).argmax(axis=1) == y_test).mean())
print(f"test accuracy of the saved model: {keras_test_accuracy:.4f}")
