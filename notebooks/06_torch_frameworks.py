# Databricks notebook source
# MAGIC %md
# MAGIC # 6. PyTorch Lightning, FSDP and DeepSpeed through sparkdist
# MAGIC
# MAGIC Code written for `torchrun` or for pyspark's `TorchDistributor` runs unchanged: every rank
# MAGIC gets torchrun's environment (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
# MAGIC `MASTER_PORT`, `TORCHELASTIC_RUN_ID`, ...), so the frameworks find their world by
# MAGIC themselves. Three small models, each on two ranks of the cluster:
# MAGIC
# MAGIC 1. **PyTorch Lightning** DDP with `sparkdist.TorchDistributor` (pyspark's API);
# MAGIC 2. **FSDP2** (`torch.distributed.fsdp.fully_shard`) with `HorovodRunner`: each rank holds
# MAGIC    half of every parameter; the full model is gathered once at the end and saved;
# MAGIC 3. **DeepSpeed** ZeRO stage 1 with `sparkdist.DeepspeedTorchDistributor`.
# MAGIC
# MAGIC Everything here runs on CPU with Gloo (a GPU cluster only changes `use_gpu` and the
# MAGIC backend to NCCL). Locally, this notebook starts an embedded Spark with two executors.

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
        "/dbfs/tmp/sparkdist/06_frameworks"
        if ON_DATABRICKS
        else tempfile.mkdtemp(prefix="sparkdist-")
    )
os.makedirs(OUTPUT_DIR, exist_ok=True)


def make_data(n=256):
    """A small regression problem, the same on every rank (the frameworks shard it)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=generator)
    y = torch.stack([x[:, :4].sum(dim=1), torch.tanh(x[:, 4:]).sum(dim=1)], dim=1)
    return x, y


def make_model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 2),
    )  # fmt: skip


def full_loss(model):
    import torch

    x, y = make_data()
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x), y))


initial_loss = full_loss(make_model())
print(f"outputs in {OUTPUT_DIR}; loss of the untrained model: {initial_loss:.4f}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## 1. PyTorch Lightning with `TorchDistributor`
# MAGIC
# MAGIC The `Trainer` is configured for 2 nodes of 1 device, as for torchrun; Lightning reads the
# MAGIC ranks from the environment (`TorchElasticEnvironment`) and its `DistributedSampler` shards
# MAGIC the data. `run` returns rank 0's value.

# COMMAND ----------

from sparkdist import TorchDistributor


def lightning_fit(epochs=8):
    import pytorch_lightning as pl
    import torch

    class Regression(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = make_model()

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.01)

    torch.set_num_threads(1)
    x, y = make_data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    model = Regression()
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, num_nodes=2, strategy="ddp", max_epochs=epochs,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(model, loader)
    return {
        "world_size": trainer.world_size,
        "environment": type(trainer.strategy.cluster_environment).__name__,
        "loss": full_loss(model.net),
    }


lightning_result = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
    lightning_fit
)
print(f"Lightning on {lightning_result['world_size']} ranks: loss {lightning_result['loss']:.4f}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## 2. FSDP2: `fully_shard` on a device mesh
# MAGIC
# MAGIC `fully_shard` turns each parameter into a `DTensor` sharded on its first dimension across
# MAGIC the mesh: a rank stores, and updates, only its half. Forward and backward gather each
# MAGIC layer's parameters just in time and reduce-scatter its gradients. Each rank trains on its
# MAGIC own half of the rows; at the end `full_tensor()` gathers the whole model, rank 0 saves it.

# COMMAND ----------

from sparkdist import HorovodRunner


def fsdp_train(path, steps=60):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (size,))
    model = make_model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    shards = {
        name: (tuple(p.to_local().shape), tuple(p.shape)) for name, p in model.named_parameters()
    }

    x, y = make_data()
    x, y = x[rank::size], y[rank::size]
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    state = {name: p.full_tensor() for name, p in model.named_parameters()}  # on every rank
    if rank == 0:
        torch.save(state, path)
    dist.destroy_process_group()
    return {"rank": rank, "shards": shards}


fsdp_path = os.path.join(OUTPUT_DIR, "fsdp_model.pt")
fsdp_ranks = HorovodRunner(np=2).run_all(fsdp_train, path=fsdp_path)
for name, (local, full) in fsdp_ranks[0]["shards"].items():
    print(f"{name:<10} full {full}, each rank holds {local}")

# COMMAND ----------

# MAGIC %md
# MAGIC The saved state is an ordinary `state_dict`: load it into the plain model on the driver.

# COMMAND ----------

import torch

fsdp_model = make_model()
fsdp_model.load_state_dict(torch.load(fsdp_path))
fsdp_loss = full_loss(fsdp_model)
print(f"FSDP model, gathered and reloaded: loss {fsdp_loss:.4f}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## 3. DeepSpeed ZeRO-1 with `DeepspeedTorchDistributor`
# MAGIC
# MAGIC ZeRO stage 1 partitions the optimizer state across the ranks. On CPU, DeepSpeed talks
# MAGIC through Gloo (`dist_backend`); the optimizer is a plain torch one handed to
# MAGIC `deepspeed.initialize`, so no DeepSpeed kernels need compiling. With a function,
# MAGIC the configuration is an argument like any other (a script would get
# MAGIC `--deepspeed_config` from the distributor's `deepspeedConfig`).

# COMMAND ----------

from sparkdist import DeepspeedTorchDistributor

DEEPSPEED_CONFIG = {
    "train_micro_batch_size_per_gpu": 16,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 1},
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 1000,
}


def deepspeed_train(config, epochs=4):
    import deepspeed
    import torch

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    model = make_model()
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01), config=config
    )
    rank, size = engine.global_rank, engine.world_size
    x, y = make_data()
    x, y = x[rank::size], y[rank::size]
    batch = config["train_micro_batch_size_per_gpu"]
    for _ in range(epochs):
        for start in range(0, len(x), batch):
            loss = torch.nn.functional.mse_loss(
                engine(x[start : start + batch]), y[start : start + batch]
            )
            engine.backward(loss)
            engine.step()
    return {
        "world_size": size,
        "zero_stage": engine.zero_optimization_stage(),
        "loss": full_loss(engine.module),
    }


deepspeed_result = DeepspeedTorchDistributor(
    numGpus=1, nnodes=2, localMode=False, useGpu=False
).run(deepspeed_train, DEEPSPEED_CONFIG)
print(
    f"DeepSpeed ZeRO-{deepspeed_result['zero_stage']} on {deepspeed_result['world_size']} ranks: "
    f"loss {deepspeed_result['loss']:.4f}"
)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Summary

# COMMAND ----------

summary = {
    "untrained": initial_loss,
    "Lightning DDP (TorchDistributor)": lightning_result["loss"],
    "FSDP2 fully_shard (HorovodRunner)": fsdp_loss,
    "DeepSpeed ZeRO-1 (DeepspeedTorchDistributor)": deepspeed_result["loss"],
}
for name, value in summary.items():
    print(f"{name:<46} loss {value:.4f}")
