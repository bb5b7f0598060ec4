# Databricks notebook source
# MAGIC %md
# MAGIC # 1. From single-node PyTorch to distributed training with sparkdist
# MAGIC
# MAGIC The migration path of Databricks' HorovodRunner guide, step by step, on a small model
# MAGIC (scikit-learn's digits, so it runs anywhere in a minute):
# MAGIC
# MAGIC 1. train on one machine, as usual;
# MAGIC 2. change the training function for Horovod: `hvd.init()`, pin the GPU by local rank,
# MAGIC    shard the data, scale the learning rate by the number of workers, wrap the
# MAGIC    optimizer in `hvd.DistributedOptimizer`, broadcast the initial state from rank 0,
# MAGIC    checkpoint on rank 0 only;
# MAGIC 3. test it on the driver with `HorovodRunner(np=-2)` (two processes, no cluster);
# MAGIC 4. run it on the cluster with `HorovodRunner(np=2)`;
# MAGIC 5. the same model with PyTorch's own `DistributedDataParallel`, under the same runner.
# MAGIC
# MAGIC **Cluster set-up (Databricks):** an ML runtime cluster with `init_scripts/sparkdist_init.sh`
# MAGIC as init script (it installs Open MPI, builds Horovod for the installed torch and installs
# MAGIC sparkdist). Locally, this notebook starts an embedded Spark with two executors.

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
    # Checkpoints must go where every node can write and the driver can read: /dbfs on
    # Databricks (or a Unity Catalog volume under /Volumes), a temp directory locally.
    OUTPUT_DIR = (
        "/dbfs/tmp/sparkdist/01_pytorch" if ON_DATABRICKS else tempfile.mkdtemp(prefix="sparkdist-")
    )
os.makedirs(OUTPUT_DIR, exist_ok=True)
print(f"Spark master: {spark.sparkContext.master}; outputs in {OUTPUT_DIR}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Step 1: single-node training
# MAGIC
# MAGIC An ordinary PyTorch loop. Everything the function needs is imported inside it: that is
# MAGIC what lets sparkdist ship it to other processes later.

# COMMAND ----------


def load_data():
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    return train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)


def make_model():
    import torch

    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def test_accuracy(model, x, y):
    import torch

    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(dim=1).numpy() == y).mean())


def train_single(epochs=6, lr=0.005, batch_size=32):
    import torch

    torch.manual_seed(0)
    x_train, x_test, y_train, y_test = load_data()
    x_train, y_train = torch.from_numpy(x_train), torch.from_numpy(y_train)
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(epochs):
        order = torch.randperm(len(x_train))
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            optimizer.zero_grad()
            loss_fn(model(x_train[idx]), y_train[idx]).backward()
            optimizer.step()
    return test_accuracy(model, x_test, y_test)


single_accuracy = train_single()
print(f"single node: test accuracy {single_accuracy:.4f}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Step 2: the same training with Horovod
# MAGIC
# MAGIC The numbered comments are the seven changes of the migration guide. Nothing else
# MAGIC changes: the runner starts one process per rank and Horovod connects them.

# COMMAND ----------


def train_hvd(epochs=6, lr=0.005, batch_size=32, checkpoint_dir=None):
    import horovod.torch as hvd
    import torch

    hvd.init()  # 1. initialise Horovod
    if torch.cuda.is_available():  # 2. pin one GPU per process, by local rank
        torch.cuda.set_device(hvd.local_rank())
    torch.manual_seed(0)
    torch.set_num_threads(1)

    x_train, x_test, y_train, y_test = load_data()
    x_train = torch.from_numpy(x_train[hvd.rank() :: hvd.size()])  # 3. each rank its shard
    y_train = torch.from_numpy(y_train[hvd.rank() :: hvd.size()])

    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr * hvd.size())  # 4. scale the LR
    optimizer = hvd.DistributedOptimizer(  # 5. average gradients across ranks
        optimizer, named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # 6. start from rank 0's state
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(1, epochs + 1):
        order = torch.randperm(len(x_train))
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            optimizer.zero_grad()
            loss_fn(model(x_train[idx]), y_train[idx]).backward()
            optimizer.step()
        if hvd.rank() == 0 and checkpoint_dir:  # 7. checkpoint on rank 0 only
            path = os.path.join(checkpoint_dir, f"checkpoint-{epoch}.pt")
            torch.save({"epoch": epoch, "model": model.state_dict()}, path)
    accuracy = test_accuracy(model, x_test, y_test)
    print(f"rank {hvd.rank()} of {hvd.size()}: test accuracy {accuracy:.4f}")
    return {"accuracy": accuracy, "size": hvd.size()}


# COMMAND ----------

# MAGIC %md
# MAGIC ## Step 3: test on the driver (`np=-2`)
# MAGIC
# MAGIC Negative `np` runs `-np` processes on the driver: quick to iterate on, no cluster
# MAGIC resources, the same output and errors as on the cluster.

# COMMAND ----------

from sparkdist import HorovodRunner

driver_result = HorovodRunner(np=-2).run(train_hvd, epochs=3)
print(f"driver, 2 processes: test accuracy {driver_result['accuracy']:.4f}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Step 4: run on the cluster (`np=2`)
# MAGIC
# MAGIC Positive `np` runs one rank per Spark barrier task. Each rank's output streams here,
# MAGIC prefixed with its rank; `run` returns rank 0's value.

# COMMAND ----------

checkpoint_dir = os.path.join(OUTPUT_DIR, "checkpoints")
os.makedirs(checkpoint_dir, exist_ok=True)
runner = HorovodRunner(np=2)
hvd_result = runner.run(train_hvd, epochs=6, checkpoint_dir=checkpoint_dir)
print(
    f"cluster, {hvd_result['size']} ranks: test accuracy {hvd_result['accuracy']:.4f} "
    f"in {runner.last_job.wall_time_s:.1f}s ({runner.last_job.launcher} launcher)"
)

# COMMAND ----------

# MAGIC %md
# MAGIC Only rank 0 wrote checkpoints. Load the last one on the driver and evaluate it.

# COMMAND ----------

import torch

checkpoints = sorted(os.listdir(checkpoint_dir), key=lambda name: int(name.split("-")[1][:-3]))
restored = make_model()
restored.load_state_dict(torch.load(os.path.join(checkpoint_dir, checkpoints[-1]))["model"])
_, x_test, _, y_test = load_data()
restored_accuracy = test_accuracy(restored, x_test, y_test)
print(f"{len(checkpoints)} checkpoints; the last one scores {restored_accuracy:.4f}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Step 5: the same model with DistributedDataParallel
# MAGIC
# MAGIC No Horovod needed: the runner sets `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR` and
# MAGIC `MASTER_PORT` on every rank, so `init_process_group` needs no arguments. The
# MAGIC `DistributedSampler` shards the data; DDP averages the gradients.

# COMMAND ----------


def train_ddp(epochs=6, lr=0.005, batch_size=32):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    torch.manual_seed(0)
    torch.set_num_threads(1)

    x_train, x_test, y_train, y_test = load_data()
    dataset = TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
    sampler = DistributedSampler(dataset, seed=0)  # each rank its shard
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    model = DistributedDataParallel(
        make_model().to(device), device_ids=[local_rank] if use_cuda else None
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=lr * dist.get_world_size())
    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
    accuracy = test_accuracy(model.module.cpu(), x_test, y_test)
    size = dist.get_world_size()
    dist.destroy_process_group()
    return {"accuracy": accuracy, "size": size}


ddp_result = HorovodRunner(np=2).run(train_ddp, epochs=6)
print(f"DDP, {ddp_result['size']} ranks: test accuracy {ddp_result['accuracy']:.4f}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Summary

# COMMAND ----------

summary = {
    "single node": single_accuracy,
    "Horovod on the driver (np=-2, 3 epochs)": driver_result["accuracy"],
    "Horovod on the cluster (np=2)": hvd_result["accuracy"],
    "DistributedDataParallel (np=2)": ddp_result["accuracy"],
}
for name, value in summary.items():
    print(f"{name:<42} {value:.4f}")
