"""Spark DataFrames as arguments of a job: each rank reads its own shard."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pytest

from sparkdist import HorovodRunner
from sparkdist.demos.digits import load_digits_split, train_digits_ddp

EPOCHS = 15


def train_from_converter(train, x_test, y_test, epochs):
    """DDP on digits, fed by a sparkdist.data converter made from a Spark DataFrame."""
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from sparkdist.demos.digits import accuracy, make_model

    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    assert int(os.environ["RANK"]) == dist.get_rank()
    model = DistributedDataParallel(make_model())
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    batch_size = 32
    rows = 0
    with train.make_torch_dataloader(
        batch_size=batch_size, num_epochs=epochs, shuffle=True
    ) as loader:
        for batch in loader:  # the same number of batches on every rank
            optimizer.zero_grad()
            loss = loss_fn(model(batch["features"]), batch["label"].long())
            loss.backward()
            optimizer.step()
            rows += len(batch["label"])
    result = {"accuracy": accuracy(model.module, x_test, y_test), "rows": rows}
    dist.destroy_process_group()
    return result


@pytest.fixture(scope="module")
def digits_frames(spark):
    from pyspark.ml.feature import VectorAssembler

    x_train, x_test, y_train, y_test = load_digits_split()
    frame = pd.DataFrame(x_train, columns=[f"p{i}" for i in range(64)])
    frame["label"] = y_train.astype("int64")
    df = VectorAssembler(inputCols=list(frame.columns[:64]), outputCol="features").transform(
        spark.createDataFrame(frame)
    )
    return df.select("features", "label"), x_test, y_test


def test_ddp_from_spark_dataframe_matches_in_memory(digits_frames):
    df, x_test, y_test = digits_frames
    runner = HorovodRunner(np=2)
    from_df = runner.run_all(
        train_from_converter, train=df, x_test=x_test, y_test=y_test, epochs=EPOCHS
    )
    in_memory = HorovodRunner(np=2).run(train_digits_ddp, epochs=EPOCHS)
    assert from_df[0]["accuracy"] >= in_memory["accuracy"] - 0.02
    assert from_df[0]["accuracy"] >= 0.9
    # Each rank read the same number of rows: its own shard, batch after batch.
    assert from_df[0]["rows"] == from_df[1]["rows"] > 0


def readme_loop(train, epochs: int, kill_step: int | None) -> dict:
    """The README's DDP loop, resumable: a checkpoint per step holds the loader's position.

    Every step gathers the ids each rank read (so the job records what the world
    consumed, across attempts); on its first attempt rank 1 SIGKILLs itself after
    ``kill_step`` steps.
    """
    import os
    import signal

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from sparkdist import checkpoint

    torch.manual_seed(0)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    seen, step, resumed_at = [], 0, None
    with train.make_torch_dataloader(batch_size=100, num_epochs=1, shuffle=True, seed=42) as loader:
        found = checkpoint.latest()
        if found:
            step, state = found
            model.module.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            loader.load_state_dict(state["loader"])
            seen, resumed_at = state["seen"], state["loader"]
        for epoch in range(loader.epoch, epochs):
            for batch in loader:
                optimizer.zero_grad()
                model(batch["x"].unsqueeze(1)).pow(2).mean().backward()  # allreduce
                optimizer.step()
                ids = [torch.zeros_like(batch["id"]) for _ in range(world)]
                dist.all_gather(ids, batch["id"])
                seen.append((epoch, [part.tolist() for part in ids]))
                step += 1
                state = {
                    "model": model.module.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "loader": loader.state_dict(),
                    "seen": seen,
                }
                checkpoint.save(state, step=step)
                dist.barrier()  # the checkpoint of this step is stored before anyone dies
                if rank == 1 and checkpoint.attempt() == 0 and step == kill_step:
                    os.kill(os.getpid(), signal.SIGKILL)
    dist.destroy_process_group()
    return {"seen": seen, "attempt": checkpoint.attempt(), "resumed_at": resumed_at}


def test_readme_loop_equal_steps_global_shuffle_and_resume_after_a_kill(spark):
    """2001 rows, 2 ranks, batch 100: equal steps; a rank killed mid-epoch resumes exactly."""
    df = spark.range(2001).selectExpr("id", "cast(id as float) / 2001 as x").repartition(3)
    runner = HorovodRunner(np=2, start_timeout=120, max_failures=1)
    result = runner.run(readme_loop, train=df, epochs=2, kill_step=5)

    report = runner.last_job
    assert report.attempts == 2 and "SIGKILL" in report.failures[0]
    assert result["attempt"] == 1
    assert result["resumed_at"]["epoch"] == 0
    assert result["resumed_at"]["rows_consumed"] == 5 * 100 * 2  # 5 steps x batch x world
    for epoch in range(2):
        steps = [ids for e, ids in result["seen"] if e == epoch]
        assert len(steps) == 11  # 1001 rows a rank: 10 x 100 + 1, the same on both ranks
        assert all(len(a) == len(b) for a, b in steps)
        rows = Counter(i for step in steps for part in step for i in part)
        assert sorted(rows) == list(range(2001))  # every row of the epoch ...
        assert sum(rows.values()) == 2002  # ... once, plus one pad for equal steps
    # Each epoch a rank reads a different slice of the whole data.
    rank0 = [{i for e, ids in result["seen"] if e == epoch for i in ids[0]} for epoch in (0, 1)]
    assert rank0[0] != rank0[1]
    assert min(rank0[0]) < 500 and max(rank0[0]) > 1500  # not a fixed half of the ids


def horovod_loop(train) -> dict:
    """The README loop under Horovod: an allreduce per batch, one epoch of 2001 rows."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    batches, rows = 0, 0
    with train.make_torch_dataloader(batch_size=100, num_epochs=1, shuffle=True) as loader:
        for batch in loader:
            rows += int(hvd.allreduce(torch.tensor(len(batch["id"])), op=hvd.Sum))
            batches += 1
    result = {"rank": hvd.rank(), "batches": batches, "rows": rows}
    hvd.shutdown()
    return result


def test_readme_loop_under_horovod_takes_equal_steps(spark):
    df = spark.range(2001).selectExpr("id").repartition(3)
    results = HorovodRunner(np=2, start_timeout=120).run_all(horovod_loop, train=df)
    assert [r["batches"] for r in results] == [11, 11]
    assert [r["rows"] for r in results] == [2002, 2002]  # 2001 rows and one pad


def keras_loop(train) -> dict:
    """Keras fit under MultiWorkerMirroredStrategy on make_tf_dataset, 2001 rows."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    positions = []

    class SavePosition(tf.keras.callbacks.Callback):
        """What a checkpoint callback saves: the place after the steps the model took."""

        def on_train_batch_end(self, batch, logs=None):
            trained = int(self.model.optimizer.iterations.numpy())
            if trained == 5:
                positions.append((dataset.state_dict(steps=trained), dataset.state_dict()))

    with train.make_tf_dataset(batch_size=100, shuffle=True) as dataset:
        steps = dataset.steps_per_epoch
        pairs = dataset.map(lambda b: (tf.expand_dims(b.x, 1), b.x * 2))
        with strategy.scope():
            model = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1)])
            model.compile(tf.keras.optimizers.SGD(0.1), "mse")
        history = model.fit(
            pairs, epochs=2, steps_per_epoch=steps, verbose=0, callbacks=[SavePosition()]
        )
    return {"steps": steps, "loss": history.history["loss"], "positions": positions}


def test_keras_fit_on_the_tf_dataset_takes_equal_steps(spark):
    df = spark.range(2001).selectExpr("cast(id as float) / 2001 as x").repartition(3)
    runner = HorovodRunner(np=2, start_timeout=180, timeout=300)
    results = runner.run_all(keras_loop, train=df)
    assert [r["steps"] for r in results] == [11, 11]
    assert results[0]["loss"] == results[1]["loss"]  # one model, trained in step
    assert results[0]["loss"][-1] < results[0]["loss"][0]
    for result in results:  # after 5 steps of 100 rows on 2 ranks, tf.data ran ahead
        [(exact, taken)] = result["positions"]
        assert (exact["epoch"], exact["rows_consumed"]) == (0, 1000)
        assert (taken["epoch"], taken["rows_consumed"]) >= (0, 1000)


def sharded_accuracy(test) -> dict:
    """An evaluation loop: each rank scores its batches, one allreduce sums the counts.

    A fixed "model" predicts ``id % 3 == 0`` against the label ``id % 5 == 0``; the rows
    marked ``is_pad`` (read twice for equal steps) are left out of the masked counts.
    """
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    counts = torch.zeros(4, dtype=torch.int64)  # masked correct, masked rows, all correct, all
    batches = 0
    with test.make_torch_dataloader(
        batch_size=100, num_epochs=1, shuffle=True, pad_column="is_pad"
    ) as loader:
        for batch in loader:
            right = (batch["id"] % 3 == 0) == batch["label"].bool()
            keep = ~batch["is_pad"]
            counts += torch.tensor(
                [int(right[keep].sum()), int(keep.sum()), int(right.sum()), len(right)]
            )
            batches += 1
    dist.all_reduce(counts)
    dist.destroy_process_group()
    return {"batches": batches, "counts": counts.tolist()}


def test_sharded_metric_over_unpadded_rows_counts_each_row_once(spark):
    """1001 rows on 2 ranks: 501 rows each, one of them a pad; the mask leaves it out."""
    df = spark.range(1001).selectExpr("id", "cast(id % 5 = 0 as int) as label").repartition(3)
    results = HorovodRunner(np=2, start_timeout=120).run_all(sharded_accuracy, test=df)
    assert [r["batches"] for r in results] == [6, 6]  # equal steps
    ids = np.arange(1001)
    exact = int(((ids % 3 == 0) == (ids % 5 == 0)).sum())
    masked_right, masked_rows, all_right, all_rows = results[0]["counts"]
    assert (masked_right, masked_rows) == (exact, 1001)
    assert all_rows == 1002 and all_right in (exact, exact + 1)  # the pad, counted twice
