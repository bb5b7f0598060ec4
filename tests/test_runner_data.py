"""Spark DataFrames as arguments of a job: each rank reads its own shard."""

from __future__ import annotations

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
    rank, size = dist.get_rank(), dist.get_world_size()
    assert int(os.environ["RANK"]) == rank
    model = DistributedDataParallel(make_model())
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    batch_size = 32
    steps = len(train) // (batch_size * size)  # the same number of steps on every rank
    rows = 0
    with train.make_torch_dataloader(
        batch_size=batch_size, num_epochs=None, shuffle=True, seed=rank
    ) as loader:
        batches = iter(loader)
        for _ in range(epochs):
            for _ in range(steps):
                batch = next(batches)
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
