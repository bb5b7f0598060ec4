"""Parameter-server training on digits with TensorFlow (tested with 2.21).

Every function here runs in ONE process of a cluster described by the TF_CONFIG env var:

* `custom_loop` and `keras_fit` run on the chief only (TF_CONFIG task type "chief"); the
  cluster also has `worker` and `ps` entries, each served by a separate process running
  `tf.distribute.Server(ClusterSpec(cluster), job_name=role, task_index=i,
  protocol="grpc", start=True).join()` (see `serve`).
* `mirrored_baseline` runs on every rank of a cluster that has only `worker` entries.

Data: scikit-learn's `load_digits` (nothing is downloaded), X / 16, 20 % held out
(stratified, fixed seed). The accuracy is measured on the chief.

Findings with TF 2.21 / Keras 3.15 / tf-keras 2.21 (2 CPU cores):

* The model is built with the tf_keras package by default (`import tf_keras`, which
  works whatever `tf.keras` is; no TF_USE_LEGACY_KERAS needed). With Keras 3
  (`keras_impl="tf.keras"` without the env var) the custom loop trains with unsharded
  variables, but (a) a FixedShardsPartitioner fails in `tape.gradient` with
  "AttributeError: 'ShardedVariable' object has no attribute 'handle'" and (b)
  `optimizer.iterations` undercounts (~250 for 300 steps: racy read-modify-write).
* TF_USE_LEGACY_KERAS=1 is read at the first ACCESS of `tf.keras`, not at
  `import tensorflow`; once `tf.keras` has resolved to Keras 3, setting it is ignored.
* Keras 3 `model.fit` cannot use ParameterServerStrategy ("ValueError: To use this
  dataset, you need to pass this dataset to ClusterCoordinator.create_per_worker_dataset."
  and there is no keras.utils.experimental.DatasetCreator); tf-keras `model.fit` works
  with a DatasetCreator (or a tf.data.Dataset) plus steps_per_epoch.
* MinSizePartitioner (default min_shard_bytes 256 KiB) never shards these small
  kernels; FixedShardsPartitioner(2) shards every variable over both ps tasks.
* A killed worker (one of two): its closures are retried on the other worker and
  join() returns normally. If no worker is left, join() waits (up to an hour per
  failure) for a worker to come back at the same address (a restarted server is
  picked up), hence `join_timeout`. A killed ps makes the next schedule()/join()
  raise tf.errors.UnavailableError (mentioning /job:ps) within about a second.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

HIDDEN = 128


# --------------------------------------------------------------------------- helpers


def load_split(seed: int = 0):
    """(x_train, x_test, y_train, y_test) as float32 / int32 numpy arrays."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int32)
    return train_test_split(x, y, test_size=0.2, stratify=y, random_state=seed)


def tf_config() -> dict:
    return json.loads(os.environ["TF_CONFIG"])


def serve(role: str, index: int, cluster: dict | None = None) -> None:
    """Run a worker or ps server forever (what the runner does on non-chief ranks)."""
    import tensorflow as tf

    cluster = cluster or tf_config()["cluster"]
    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster),
        job_name=role,
        task_index=index,
        protocol="grpc",
        start=True,
    )
    server.join()


def file_barrier(
    after_step: int, ready_path: str, go_path: str, timeout: float = 300.0, poll: float = 0.05
) -> Callable[[int], None]:
    """An `on_step` hook for `custom_loop`: after scheduling step `after_step` the chief
    creates `ready_path` and blocks until `go_path` exists (e.g. until a test has killed
    a worker). Raises TimeoutError after `timeout` seconds."""

    def on_step(step: int) -> None:
        if step != after_step:
            return
        Path(ready_path).write_text(str(step))
        deadline = time.monotonic() + timeout
        while not os.path.exists(go_path):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{go_path} did not appear within {timeout} s")
            time.sleep(poll)

    return on_step


def _variable_devices(variables) -> list[str]:
    """Device strings of the (possibly Keras-wrapped, possibly sharded) variables."""
    devices = []
    for v in variables:
        inner = getattr(v, "value", v)  # Keras 3 Variable -> tf variable
        if callable(inner):  # tf.Variable.value is a method
            inner = v
        shards = getattr(inner, "variables", None)  # ShardedVariable
        for part in shards if shards is not None else [inner]:
            devices.append(part.device)
    return devices


def _keras(impl: str, shards: int = 1):
    """The Keras module to build the model with.

    "tf.keras": whatever `tf.keras` is (Keras 3 unless TF_USE_LEGACY_KERAS=1 was set
    before tensorflow was imported); "tf_keras": the tf-keras (Keras 2) package;
    "auto": tf_keras when variables are sharded (Keras 3 cannot take gradients of a
    ShardedVariable), else tf.keras."""
    if impl == "auto":
        impl = "tf_keras" if shards > 1 else "tf.keras"
    if impl == "tf_keras":
        import tf_keras

        return tf_keras
    if impl == "tf.keras":
        import tensorflow as tf

        return tf.keras
    raise ValueError(f"keras_impl must be 'auto', 'tf.keras' or 'tf_keras', not {impl!r}")


def _keras_name(keras) -> str:
    version = getattr(keras, "__version__", None) or getattr(keras, "version", lambda: "?")()
    return f"{getattr(keras, '__name__', keras)} {version}"


def _mlp(keras):
    return keras.Sequential(
        [
            keras.Input(shape=(64,)),
            keras.layers.Dense(HIDDEN, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def _ps_strategy(tf, shards: int):
    """ParameterServerStrategy over the TF_CONFIG cluster, variables in `shards` shards."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return tf.distribute.ParameterServerStrategy(
        resolver, variable_partitioner=_partitioner(tf, shards)
    )


def _repeated_batches(tf, x, y, batch_size: int, seed: int):
    """A worker's endless stream of shuffled batches (its dataset_fn)."""
    return (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(len(x), seed=seed, reshuffle_each_iteration=True)
        .repeat()
        .batch(batch_size, drop_remainder=True)
        .prefetch(2)
    )


def _partitioner(tf, shards: int):
    if shards <= 1:
        return None
    return tf.distribute.experimental.partitioners.FixedShardsPartitioner(shards)


def _join(coordinator, timeout: float | None) -> None:
    """`coordinator.join()`, raising TimeoutError after `timeout` seconds.

    join() never returns when every worker is gone: the coordinator waits (up to an
    hour per failure) for a worker to come back at the same address."""
    if timeout is None:
        coordinator.join()
        return
    import threading

    outcome: list = []

    def target():
        try:
            coordinator.join()
            outcome.append(None)
        except BaseException as error:  # re-raised in the caller's thread
            outcome.append(error)

    thread = threading.Thread(target=target, name="coordinator-join", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(
            f"coordinator.join() did not finish within {timeout} s (no live worker?)"
        )
    if outcome and outcome[0] is not None:
        raise outcome[0]


def _accuracy(model, x, y) -> float:
    import numpy as np

    logits = np.asarray(model(x, training=False))
    return float((logits.argmax(axis=1) == y).mean())


# --------------------------------------------------------------------------- PS loop


def custom_loop(
    steps: int = 300,
    batch_size: int = 64,
    shards: int = 1,
    seed: int = 0,
    learning_rate: float = 0.01,
    on_step: Callable[[int], None] | None = None,
    keras_impl: str = "tf_keras",
    join_timeout: float | None = None,
) -> dict:
    """Train with ParameterServerStrategy + ClusterCoordinator and a custom loop.

    `on_step(k)` (if given) is called on the chief right after step k (1-based) has been
    scheduled; use it (or `file_barrier`) to kill a worker at a known point.
    """
    started = time.perf_counter()
    import tensorflow as tf

    imported = time.perf_counter()
    keras = _keras(keras_impl, shards)
    x_train, x_test, y_train, y_test = load_split(seed)
    keras.utils.set_random_seed(seed)

    strategy = _ps_strategy(tf, shards)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    connected = time.perf_counter()

    def dataset_fn(_input_context=None):
        return _repeated_batches(tf, x_train, y_train, batch_size, seed)

    with strategy.scope():
        model = _mlp(keras)
        optimizer = keras.optimizers.Adam(learning_rate)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    per_worker_dataset = coordinator.create_per_worker_dataset(dataset_fn)
    per_worker_iterator = iter(per_worker_dataset)

    @tf.function
    def train_step(iterator):
        def replica_fn(x, y):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = tf.nn.compute_average_loss(loss_fn(y, logits))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))  # noqa: B905 (autograph)
            return loss

        x, y = next(iterator)
        losses = strategy.run(replica_fn, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    t0 = time.perf_counter()
    first = coordinator.schedule(train_step, args=(per_worker_iterator,))
    first_loss = float(first.fetch())
    t1 = time.perf_counter()
    if on_step is not None:
        on_step(1)
    last = first
    for step in range(2, steps + 1):
        last = coordinator.schedule(train_step, args=(per_worker_iterator,))
        if on_step is not None:
            on_step(step)
    _join(coordinator, join_timeout)
    t2 = time.perf_counter()
    last_loss = float(last.fetch())

    accuracy = _accuracy(model, x_test, y_test)
    cluster = tf_config()["cluster"]
    return {
        "accuracy": accuracy,
        "steps": steps,
        "batch_size": batch_size,
        "examples_per_second": steps * batch_size / (t2 - t0),
        "steady_examples_per_second": ((steps - 1) * batch_size / (t2 - t1) if steps > 1 else None),
        "import_seconds": imported - started,
        "connect_seconds": connected - imported,
        "first_step_seconds": t1 - t0,
        "train_seconds": t2 - t0,
        "total_seconds": time.perf_counter() - started,
        "first_loss": first_loss,
        "last_loss": last_loss,
        "optimizer_iterations": int(optimizer.iterations.numpy()),
        "variable_devices": _variable_devices(model.variables),
        "num_workers": len(cluster.get("worker", [])),
        "num_ps": len(cluster.get("ps", [])),
        "shards": shards,
        "keras": _keras_name(keras),
    }


# --------------------------------------------------------------------------- model.fit


def _legacy_tf_keras(tf):
    """`tf.keras` if it is tf-keras (Keras 2), else raise a clear error."""
    module = tf.keras.layers.Dense.__module__
    if not module.startswith("tf_keras"):
        raise RuntimeError(
            "tf.keras is Keras 3 in this process (tf.keras.layers.Dense comes from "
            f"{module}); Keras 3 model.fit does not support ParameterServerStrategy. "
            "Set TF_USE_LEGACY_KERAS=1 in the rank's environment (the runner's env "
            "option) before the first use of tf.keras, or use keras_impl='tf_keras'."
        )
    return tf.keras


def keras_fit(
    epochs: int = 5,
    steps_per_epoch: int = 60,
    batch_size: int = 64,
    shards: int = 1,
    seed: int = 0,
    learning_rate: float = 0.01,
    steps_per_execution: int = 1,
    keras_impl: str = "tf_keras",
) -> dict:
    """`model.fit` under ParameterServerStrategy, with tf-keras (Keras 2).

    keras_impl="tf_keras" imports the tf_keras package directly, which works whatever
    `tf.keras` is (no env var needed); "tf.keras" uses `tf.keras` and requires it to
    be tf-keras (TF_USE_LEGACY_KERAS=1 set before the first access of `tf.keras`).
    Keras 3 cannot do this (see the error in `_legacy_tf_keras`)."""
    started = time.perf_counter()
    import tensorflow as tf

    if keras_impl == "tf.keras":
        keras = _legacy_tf_keras(tf)
    elif keras_impl == "tf_keras":
        import tf_keras as keras
    else:
        raise ValueError(f"keras_impl must be 'tf_keras' or 'tf.keras', not {keras_impl!r}")
    imported = time.perf_counter()
    x_train, x_test, y_train, y_test = load_split(seed)
    keras.utils.set_random_seed(seed)

    strategy = _ps_strategy(tf, shards)
    connected = time.perf_counter()

    def dataset_fn(_input_context=None):
        return _repeated_batches(tf, x_train, y_train, batch_size, seed)

    with strategy.scope():
        model = _mlp(keras)
        model.compile(
            optimizer=keras.optimizers.Adam(learning_rate),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            steps_per_execution=steps_per_execution,
        )
    t0 = time.perf_counter()
    history = model.fit(
        keras.utils.experimental.DatasetCreator(dataset_fn),
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        verbose=0,
    )
    t1 = time.perf_counter()
    accuracy = _accuracy(model, x_test, y_test)
    cluster = tf_config()["cluster"]
    steps = epochs * steps_per_epoch
    return {
        "accuracy": accuracy,
        "steps": steps,
        "batch_size": batch_size,
        "examples_per_second": steps * batch_size / (t1 - t0),
        "import_seconds": imported - started,
        "connect_seconds": connected - imported,
        "train_seconds": t1 - t0,
        "total_seconds": time.perf_counter() - started,
        "loss": [float(v) for v in history.history["loss"]],
        "train_accuracy": [float(v) for v in history.history["accuracy"]],
        "variable_devices": _variable_devices(model.variables),
        "num_workers": len(cluster.get("worker", [])),
        "num_ps": len(cluster.get("ps", [])),
        "shards": shards,
        "keras": _keras_name(keras),
    }


# --------------------------------------------------------------------------- MWMS


def mirrored_baseline(
    steps: int = 300,
    batch_size: int = 64,
    seed: int = 0,
    learning_rate: float = 0.01,
    keras_impl: str = "tf_keras",
) -> dict:
    """The same model and number of examples with MultiWorkerMirroredStrategy.

    Run on EVERY rank (TF_CONFIG has only `worker` entries). To match `custom_loop`
    (`steps` steps of `batch_size` examples, each step on one worker), every worker
    takes `batch_size` examples per synchronous step (global batch = batch_size * N)
    for ceil(steps / N) steps, i.e. the same per-step work per worker and >= the same
    total number of examples. Every rank returns a dict; the accuracy is computed on
    every rank (the weights are identical)."""
    started = time.perf_counter()
    import tensorflow as tf

    imported = time.perf_counter()
    keras = _keras(keras_impl)
    x_train, x_test, y_train, y_test = load_split(seed)
    keras.utils.set_random_seed(seed)

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    connected = time.perf_counter()
    workers = strategy.num_replicas_in_sync
    global_batch = batch_size * workers
    sync_steps = -(-steps // workers)

    def dataset_fn(input_context):
        return (
            tf.data.Dataset.from_tensor_slices((x_train, y_train))
            .shuffle(
                len(x_train),
                seed=seed + input_context.input_pipeline_id,
                reshuffle_each_iteration=True,
            )
            .repeat()
            .batch(input_context.get_per_replica_batch_size(global_batch), drop_remainder=True)
            .prefetch(2)
        )

    dataset = strategy.distribute_datasets_from_function(dataset_fn)
    with strategy.scope():
        model = _mlp(keras)
        optimizer = keras.optimizers.Adam(learning_rate)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def train_step(iterator):
        def replica_fn(x, y):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = tf.nn.compute_average_loss(
                    loss_fn(y, logits), global_batch_size=global_batch
                )
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))  # noqa: B905 (autograph)
            return loss

        x, y = next(iterator)
        losses = strategy.run(replica_fn, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    iterator = iter(dataset)
    t0 = time.perf_counter()
    first_loss = float(train_step(iterator))
    t1 = time.perf_counter()
    loss = first_loss
    for _ in range(sync_steps - 1):
        loss = train_step(iterator)
    last_loss = float(loss)
    t2 = time.perf_counter()
    examples = sync_steps * global_batch
    return {
        "accuracy": _accuracy(model, x_test, y_test),
        "steps": sync_steps,
        "batch_size": batch_size,
        "global_batch_size": global_batch,
        "examples": examples,
        "examples_per_second": examples / (t2 - t0),
        "steady_examples_per_second": (
            (sync_steps - 1) * global_batch / (t2 - t1) if sync_steps > 1 else None
        ),
        "import_seconds": imported - started,
        "connect_seconds": connected - imported,
        "first_step_seconds": t1 - t0,
        "train_seconds": t2 - t0,
        "total_seconds": time.perf_counter() - started,
        "first_loss": first_loss,
        "last_loss": last_loss,
        "num_workers": workers,
        "keras": _keras_name(keras),
    }
