"""What the cluster tests ask a driver process (`remote_driver.py`) to do, and the
training functions its ranks run. Imported by name on the driver and by the ranks
(the driver's import path reaches them), so everything here is plain functions."""

from __future__ import annotations

import importlib
import json
import logging
import os
import time
from dataclasses import asdict
from typing import Any

# --- on the driver ---------------------------------------------------------------------


def run_job(
    spark,
    main: str,
    np: int = 3,
    runner: dict | None = None,
    kwargs: dict | None = None,
    id_frames: dict[str, dict] | None = None,
) -> dict[str, Any]:
    """Run `main` (a function of this module, or "module.function" of another one on the
    import path) with HorovodRunner; report what happened,
    failures included, as plain data. `id_frames` maps an argument of `main` to
    ``{"rows": n, "path": dir}``: a DataFrame of ids 0..n-1 stored as Parquet in `dir`
    (on the hosts' shared disk) and passed as that argument, so the ranks read it."""
    from sparkdist import HorovodRunner, SparkdistError

    kwargs = dict(kwargs or {})
    for name, frame in (id_frames or {}).items():
        # Three files of consecutive ids, the same in every run (repartition deals at random).
        spark.range(0, frame["rows"], 1, 3).write.mode("overwrite").parquet(frame["path"])
        kwargs[name] = spark.read.parquet(frame["path"])
    hr = HorovodRunner(np=np, **(runner or {}))
    out: dict[str, Any] = {"ok": False, "values": None}
    try:
        out["values"] = hr.run_all(_function(main), **kwargs)
        out["ok"] = True
    except SparkdistError as exc:
        out["failed_at"] = time.time()
        logging.getLogger(__name__).warning("job of %s failed: %s", main, exc)
        out.update(
            error_type=type(exc).__name__,
            error=str(exc),
            rank=getattr(exc, "rank", None),
            host=getattr(exc, "host", None),
        )
    job = hr.last_job
    if job is not None:
        out["job_id"] = job.job_id
        out["processes"] = [asdict(p) for p in job.processes]
        out["attempts"] = job.attempts
        out["failures"] = job.failures
        out["wall_time_s"] = job.wall_time_s
        out["reformed"] = job.reformed
        out["trace_instants"] = _instants(job.trace)
    return out


def _function(name: str):
    """A function of this module by name, or "module.function" of another module."""
    if "." not in name:
        return globals()[name]
    module, function = name.rsplit(".", 1)
    return getattr(importlib.import_module(module), function)


def _instants(path: str | None) -> list[dict]:
    """The job trace's instants (issue 63), as (pid, name, args) records; [] without one."""
    if path is None:
        return []
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    return [
        {"pid": e["pid"], "name": e["name"], "args": e.get("args", {})}
        for e in events
        if e["ph"] == "i"
    ]


def executor_hosts(spark) -> list[str]:
    """The hosts of this application's executors (the driver excluded)."""
    sc = spark.sparkContext
    infos = sc._jsc.sc().statusTracker().getExecutorInfos()
    driver = sc.getConf().get("spark.driver.host")
    return sorted(i.host() for i in infos if i.host() != driver)


# --- on the ranks ----------------------------------------------------------------------


def _tcp_peers() -> list[str]:
    """The remote addresses of this process's TCP connections."""
    import psutil

    return sorted({c.raddr.ip for c in psutil.Process().net_connections("tcp") if c.raddr})


def network_main() -> dict[str, Any]:
    """One torch.distributed allreduce; report where this rank ran and which addresses
    and interfaces it was given and actually talked to."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    peers = _tcp_peers()
    dist.destroy_process_group()
    env = os.environ
    return {
        "rank": dist.get_rank() if dist.is_initialized() else int(env["RANK"]),
        "sum": value.item(),
        "host": env["SPARKDIST_TASK_HOST"],
        "master_addr": env["MASTER_ADDR"],
        "gloo_ifname": env.get("GLOO_SOCKET_IFNAME"),
        "btl_tcp_if_include": env.get("OMPI_MCA_btl_tcp_if_include"),
        "oob_tcp_if_include": env.get("OMPI_MCA_oob_tcp_if_include"),
        "peers": peers,
    }


def train_main(
    epochs: int, progress_dir: str, epoch_s: float = 0.5, gloo_timeout_s: float = 20.0
) -> dict[str, Any]:
    """A small data-parallel regression with DDP that takes `epoch_s` per epoch and
    writes its progress (epoch, pid) to `progress_dir/rank-N.json`, so that a test can
    strike mid-training."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=gloo_timeout_s))
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = x @ torch.arange(1.0, 9.0) + 0.5
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    path = os.path.join(progress_dir, f"rank-{rank}.json")
    loss = None
    for epoch in range(epochs):
        shard = slice(rank, None, size)
        for start in range(0, 256 // size, 16):
            xb = x[shard][start : start + 16]
            yb = y[shard][start : start + 16]
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb).squeeze(1), yb)
            loss.backward()
            optimizer.step()
        with open(path + ".tmp", "w") as f:
            json.dump({"epoch": epoch + 1, "pid": os.getpid(), "ppid": os.getppid()}, f)
        os.replace(path + ".tmp", path)
        time.sleep(epoch_s)
    dist.destroy_process_group()
    return {"rank": rank, "loss": float(loss), "host": os.environ["SPARKDIST_TASK_HOST"]}


def horovod_main() -> dict[str, Any]:
    """Horovod (torch) across the hosts: init, an allreduce, a short training."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    total = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum, name="check")
    torch.manual_seed(0)
    x = torch.randn(128, 4)
    y = x @ torch.tensor([1.0, -2.0, 3.0, 0.5])
    model = torch.nn.Linear(4, 1)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    xs, ys = x[hvd.rank() :: hvd.size()], y[hvd.rank() :: hvd.size()]
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xs).squeeze(1), ys)
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    weights = hvd.allgather_object([float(v) for v in model.weight.view(-1)])
    return {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "sum": float(total[0]),
        "host": os.environ["SPARKDIST_TASK_HOST"],
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "same_weights": all(w == weights[0] for w in weights),
        "peers": _tcp_peers(),
    }


def tensorflow_main(epochs: int = 3) -> dict[str, Any]:
    """Keras fit under MultiWorkerMirroredStrategy across the hosts."""
    import numpy as np
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype(np.float32)
    y = (x @ np.arange(1.0, 9.0, dtype=np.float32)).reshape(-1, 1)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input(shape=(8,)), tf.keras.layers.Dense(1)])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
    history = model.fit(data, epochs=epochs, verbose=0)
    return {
        "replicas": strategy.num_replicas_in_sync,
        "tf_config": json.loads(os.environ["TF_CONFIG"]),
        "loss": history.history["loss"],
        "host": os.environ["SPARKDIST_TASK_HOST"],
    }


def app_id(spark) -> str:
    return spark.sparkContext.applicationId


def resumable_main(epochs: int, progress_dir: str, epoch_s: float = 0.3) -> dict[str, Any]:
    """DDP regression that checkpoints (model, optimizer, epochs done) on rank 0 after
    every epoch and resumes from the newest checkpoint after a relaunch."""

    import torch
    import torch.distributed as dist

    from sparkdist import checkpoint

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x = torch.randn(192, 8)
    y = x @ torch.arange(1.0, 9.0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    start, history = 0, []
    found = checkpoint.latest()
    if found:
        start, state = found
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        history = state["history"]
    path = os.path.join(progress_dir, f"rank-{rank}.json")
    for epoch in range(start, epochs):
        xs, ys = x[rank::size], y[rank::size]
        for i in range(0, len(xs), 16):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xs[i : i + 16]).squeeze(1), ys[i : i + 16])
            loss.backward()
            optimizer.step()
        history.append(epoch + 1)
        state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
        checkpoint.save({**state, "history": history}, step=epoch + 1)
        with open(path + ".tmp", "w") as f:
            json.dump({"epoch": epoch + 1, "pid": os.getpid(), "attempt": checkpoint.attempt()}, f)
        os.replace(path + ".tmp", path)
        time.sleep(epoch_s)
    with torch.no_grad():
        final = float(torch.nn.functional.mse_loss(model(x).squeeze(1), y))
    dist.destroy_process_group()
    return {
        "weights": model.module.weight.view(-1).tolist() + model.module.bias.tolist(),
        "history": history,
        "resumed_from": start,
        "loss": final,
        "attempt": checkpoint.attempt(),
    }


def rpc_pipeline_main(steps: int = 20) -> dict[str, Any]:
    """tests/scripts/rpc_pipeline.py's model-parallel pipeline: one stage per rank (so per
    host), a RemoteModule on every rank but 0."""
    import sys

    scripts = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    from rpc_pipeline import pipeline

    return pipeline(steps)


def _append_line(path: str, record: dict) -> None:
    """One line per record, in one write (O_APPEND), so that readers never see half."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def _stop_agreed(rank: int, step: int, min_steps: int, max_steps: int, stop_file: str) -> bool:
    """Stop after `min_steps` once `stop_file` exists, or at `max_steps`: world rank 0
    decides, so every rank stops at the same step (one broadcast)."""
    import torch
    import torch.distributed as dist

    stop = torch.zeros(1)
    if rank == 0:
        stop[0] = float(step >= max_steps or (step >= min_steps and os.path.exists(stop_file)))
    dist.broadcast(stop, 0)
    return bool(stop.item())


def _world_batch(batches, loader, size: int):
    """This rank's next batch of ids, and what the whole world read in this step (the
    loader's epoch and every rank's ids)."""
    import torch
    import torch.distributed as dist

    epoch = loader.epoch
    ids = next(batches)["id"]
    everyone = [torch.zeros_like(ids) for _ in range(size)]
    dist.all_gather(everyone, ids)
    return ids, {"epoch": epoch, "ids": torch.cat(everyone).tolist()}


def elastic_main(
    progress_dir: str,
    min_steps: int,
    stop_file: str,
    step_s: float = 0.4,
    max_steps: int = 400,
    train=None,
    parameters: int = 0,
    save_every: int = 1,
) -> dict[str, Any]:
    """DDP regression for an elastic job: one batch a step, a checkpoint every
    `save_every` steps (`checkpoint.save(..., every=save_every)`, which also saves at
    once when the job stops at its next checkpoint: a grow, a decommission notice); rank 0
    appends (step, world size, attempt, saved) to `progress_dir/steps.jsonl` after every
    step (a step redone after a relaunch has two lines), resuming from the newest
    checkpoint at any world size. `parameters`: as in `in_process_elastic_main`, a frozen
    parameter of that many values in the model.
    With `train` (the converter of a DataFrame of ids), the batches come from its torch
    loader, whose position is in the checkpoint; a step's line then also holds the
    loader's epoch and the ids the whole world read in it.
    Stops after `min_steps` once `stop_file` exists (the test says when), or at
    `max_steps`. Each rank writes where it runs to `progress_dir/rank-N.json` when it
    starts. The pause of `step_s` comes right after the save, so a test that strikes
    as soon as it sees a step's line strikes between steps."""
    from contextlib import ExitStack

    import torch
    import torch.distributed as dist

    from sparkdist import checkpoint

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x = torch.randn(240, 8)
    y = x @ torch.arange(1.0, 9.0) + 0.5
    linear = torch.nn.Linear(8, 1)
    if parameters:
        bulk = torch.nn.Parameter(torch.zeros(parameters), requires_grad=False)
        linear.register_parameter("bulk", bulk)
    model = torch.nn.parallel.DistributedDataParallel(linear)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    step = 0
    found = checkpoint.resume()
    if found:
        step = found.step
        model.module.load_state_dict(found.state["model"])
        optimizer.load_state_dict(found.state["optimizer"])
    attempt = checkpoint.attempt()
    where = {"rank": rank, "size": size, "attempt": attempt, "pid": os.getpid()}
    with open(os.path.join(progress_dir, f"rank-{rank}.json"), "w") as f:
        json.dump({**where, "host": os.environ["SPARKDIST_TASK_HOST"]}, f)
    steps_file = os.path.join(progress_dir, "steps.jsonl")
    cleanup = ExitStack()
    loader = batches = None
    if train is not None:
        loader = cleanup.enter_context(
            train.make_torch_dataloader(batch_size=16, num_epochs=None, shuffle=True, seed=1)
        )
        if found:
            loader.load_state_dict(found.state["loader"])
        batches = iter(loader)
    while not _stop_agreed(rank, step, min_steps, max_steps, stop_file):
        read: dict[str, Any] = {}
        if batches is not None:
            ids, read = _world_batch(batches, loader, size)
            xb, yb = x[ids % len(x)], y[ids % len(x)]
        else:
            xs, ys = x[rank::size], y[rank::size]
            start = (step * 16) % max(len(xs) - 16, 1)
            xb, yb = xs[start : start + 16], ys[start : start + 16]
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb).squeeze(1), yb)
        loss.backward()
        optimizer.step()
        step += 1
        state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
        if loader is not None:
            state["loader"] = loader.state_dict()
        record = {"step": step, "world_size": size, "attempt": attempt, "at": time.time(), **read}
        try:
            saved = checkpoint.save(state, step, every=save_every)
        except checkpoint.Resize:
            _append_line(steps_file, {**record, "saved": True})  # the next world resumes after it
            raise
        if rank == 0:
            _append_line(steps_file, {**record, "saved": saved})
        time.sleep(step_s)
    cleanup.close()
    with torch.no_grad():
        final = float(torch.nn.functional.mse_loss(model(x).squeeze(1), y))
    dist.destroy_process_group()
    return {**where, "host": os.environ["SPARKDIST_TASK_HOST"], "step": step, "loss": final}


def fsdp_elastic_main(
    progress_dir: str, min_steps: int, stop_file: str, step_s: float = 0.4, max_steps: int = 400
) -> dict[str, Any]:
    """`elastic_main`'s loop with an FSDP2 model and sharded checkpoints (every rank
    writes its shard to the runner's checkpoint_dir). Before each save rank 0 writes the
    gathered parameters to `progress_dir/ref-<step>.pt`; after resuming, rank 0 writes
    `progress_dir/resumed-<attempt>.json`: the step, the world that saved it, this
    world, and whether the parameters loaded into this world's layout equal those."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import fully_shard

    from sparkdist import checkpoint

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 24), torch.nn.ReLU(), torch.nn.Linear(24, 1))
    fully_shard(model[0])
    fully_shard(model[2])
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

    def state(step: int) -> dict:
        model_state, optim_state = get_state_dict(model, optimizer)
        return {"model": model_state, "optim": optim_state, "data": {"step": step}}

    def full() -> dict:
        return {k: v.full_tensor().clone() for k, v in model.state_dict().items()}

    attempt = checkpoint.attempt()
    template = state(0)
    found = checkpoint.resume(into=template)
    step = 0
    if found:
        set_state_dict(
            model, optimizer, model_state_dict=template["model"], optim_state_dict=template["optim"]
        )
        step = template["data"]["step"]
        saved = torch.load(os.path.join(progress_dir, f"ref-{found.step}.pt"))
        now = full()
        same = all(torch.equal(now[k], saved[k]) for k in saved) and sorted(now) == sorted(saved)
        if rank == 0:
            resumed = {
                "step": found.step,
                "data_step": step,
                "from_world": found.world_size,
                "world": size,
                "same": same,
            }
            _append_line(os.path.join(progress_dir, f"resumed-{attempt}.json"), resumed)
    where = {"rank": rank, "size": size, "attempt": attempt, "pid": os.getpid()}
    with open(os.path.join(progress_dir, f"rank-{rank}.json"), "w") as f:
        json.dump({**where, "host": os.environ["SPARKDIST_TASK_HOST"]}, f)
    steps_file = os.path.join(progress_dir, "steps.jsonl")
    stop = torch.zeros(1)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    while True:
        if rank == 0:
            done = step >= max_steps or (step >= min_steps and os.path.exists(stop_file))
            stop[0] = float(done)
        dist.broadcast(stop, 0)
        if stop.item():
            break
        model(x + step).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        params = full()
        if rank == 0:
            torch.save(params, os.path.join(progress_dir, f"ref-{step}.pt"))
        record = {"step": step, "world_size": size, "attempt": attempt, "at": time.time()}
        try:
            checkpoint.save(state(step), step)
        except checkpoint.Resize:
            _append_line(steps_file, record)  # committed: the larger world resumes after it
            raise
        if rank == 0:
            _append_line(steps_file, record)
        time.sleep(step_s)
    dist.destroy_process_group()
    return {**where, "host": os.environ["SPARKDIST_TASK_HOST"], "step": step}


def executor_count(spark) -> int:
    return len(executor_hosts(spark))


def run_torch_distributor(
    spark, progress_dir: str, steps: int, step_s: float = 0.4, num_processes: int = 3
) -> dict[str, Any]:
    """pyspark's own TorchDistributor (barrier stage, torchrun in each task) on the
    same kind of training loop as `elastic_main`, without checkpoints; rank 0 appends
    (step, world size) to `progress_dir/steps.jsonl`. Reports success or the failure."""
    from pyspark.ml.torch.distributor import TorchDistributor

    def train(progress_dir: str, steps: int, step_s: float) -> int:
        # Defined here so that it travels by value: the torchrun processes cannot import
        # this module.
        import json
        import os
        import time

        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        with open(os.path.join(progress_dir, f"rank-{rank}.json"), "w") as f:
            json.dump({"rank": rank, "size": size, "attempt": 0, "pid": os.getpid()}, f)
        torch.manual_seed(0)
        x = torch.randn(240, 8)
        y = x @ torch.arange(1.0, 9.0) + 0.5
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
        xs, ys = x[rank::size], y[rank::size]
        for step in range(1, steps + 1):
            start = ((step - 1) * 16) % (len(xs) - 16)
            optimizer.zero_grad()
            out = model(xs[start : start + 16]).squeeze(1)
            torch.nn.functional.mse_loss(out, ys[start : start + 16]).backward()
            optimizer.step()
            if rank == 0:
                row = {"step": step, "world_size": size, "attempt": 0, "at": time.time()}
                fd = os.open(
                    os.path.join(progress_dir, "steps.jsonl"),
                    os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                    0o644,
                )
                os.write(fd, (json.dumps(row) + "\n").encode())
                os.close(fd)
            time.sleep(step_s)
        dist.destroy_process_group()
        return size

    out: dict[str, Any] = {"ok": False}
    try:
        distributor = TorchDistributor(num_processes=num_processes, local_mode=False, use_gpu=False)
        out["value"] = distributor.run(train, progress_dir, steps, step_s)
        out["ok"] = True
    except Exception as exc:  # noqa: BLE001 - reported to the caller
        out["failed_at"] = time.time()
        out["error_type"] = type(exc).__name__
        out["error"] = str(exc)
    return out


def _scripts_on_path() -> None:
    """tests/scripts, where the shared training code lives, on this rank's path."""
    import sys

    scripts = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)


def tf_parameter_server_main(steps: int = 300) -> dict[str, Any]:
    """The chief of a parameter-server job (roles=): tests/scripts/tf_parameter_server.py's
    custom loop; the worker and ps ranks run sparkdist's TensorFlow servers."""
    _scripts_on_path()
    from tf_parameter_server import custom_loop, tf_config

    result = custom_loop(steps=steps)
    return {"accuracy": result["accuracy"], "tf_config": tf_config()}


def rpc_parameter_server_main(epochs: int = 10) -> dict[str, Any]:
    """tests/scripts/rpc_parameter_server.py: rank 0 serves the model, the others train."""
    _scripts_on_path()
    from rpc_parameter_server import train

    return {**train(epochs=epochs), "host": os.environ.get("SPARKDIST_TASK_HOST")}


def in_process_elastic_main(
    progress_dir: str,
    stop_file: str,
    min_steps: int = 1,
    step_s: float = 0.3,
    max_steps: int = 2000,
    train=None,
    parameters: int = 0,
    elastic_timeout_s: float | None = None,
    init_sync: bool = True,
) -> dict[str, Any] | None:
    """DDP regression through `sparkdist.elastic.run` (issue 40): the survivors of a lost
    host keep their processes and go on from the last in-memory commit; newcomers get the
    state by broadcast. One step a commit.

    * Every rank appends its events to `progress_dir/events-<launch rank>.jsonl`: `enter`
      (each (re)entry of the training function: pid, generation, world rank and size, the
      step it starts from, whether the parameters are identical on every rank), `stepped`
      (each step, just before its commit) and `restored` (the state went back to the last
      commit: a broken collective was unblocked).
    * World rank 0 appends each step to `progress_dir/steps.jsonl` (step, world size,
      generation, time; with `train` also the loader's epoch and the ids the world read).
    * `train`: a converter of a DataFrame of ids; the batches come from its torch loader,
      kept in the elastic state (its position is committed, restored and synced).
    * `parameters`: a frozen parameter of that many float32 values, the bulk of a large
      model's state (committed, restored and synced as the trained ones; not trained, so
      that a step stays short).
    * `elastic_timeout_s`: SPARKDIST_ELASTIC_TIMEOUT_S for this rank.
    * `init_sync=False`: DDP does not broadcast the parameters again when it is wrapped
      (`elastic.run` has just synced them).
    Stops after `min_steps` once `stop_file` exists, or at `max_steps`; a rank that is no
    longer a member returns None."""
    from contextlib import ExitStack

    import torch
    import torch.distributed as dist

    from sparkdist import elastic

    if elastic_timeout_s is not None:
        os.environ["SPARKDIST_ELASTIC_TIMEOUT_S"] = str(elastic_timeout_s)
    # The elastic package's own account (worlds formed, broken, left) in the rank's log.
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
    logging.getLogger("sparkdist.elastic").addHandler(handler)
    logging.getLogger("sparkdist.elastic").setLevel(logging.DEBUG)
    launch, pid = int(os.environ["RANK"]), os.getpid()
    events = os.path.join(progress_dir, f"events-{launch}.jsonl")
    steps_file = os.path.join(progress_dir, "steps.jsonl")
    torch.manual_seed(launch)  # different on every rank: the sync makes them equal
    x = torch.randn(240, 8, generator=torch.Generator().manual_seed(0))
    y = x @ torch.arange(1.0, 9.0) + 0.5
    model = torch.nn.Linear(8, 1)
    if parameters:
        bulk = torch.nn.Parameter(torch.full((parameters,), float(launch)), requires_grad=False)
        model.register_parameter("bulk", bulk)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    cleanup = ExitStack()
    carried: dict[str, Any] = {}
    if train is not None:
        carried["loader"] = cleanup.enter_context(
            train.make_torch_dataloader(batch_size=16, num_epochs=None, shuffle=True, seed=1)
        )

    class RestoreProbe:
        """Logs when `restore()` brings the state back after a broken collective (its
        load_state_dict runs then, with the broken group ended; at a sync, on ranks other
        than world rank 0, it runs inside the new group and logs `synced`)."""

        def state_dict(self) -> dict:
            return {}

        def load_state_dict(self, _state: dict) -> None:
            log(event="synced" if dist.is_initialized() else "restored")

    state = elastic.TorchState(
        model=model, optimizer=optimizer, step=0, probe=RestoreProbe(), **carried
    )

    def log(**event) -> None:
        _append_line(
            events,
            {
                **event,
                "launch": launch,
                "pid": pid,
                "at": time.time(),
                "generation": state.generation,
            },
        )

    def identical() -> bool:
        """Are the parameters the same on every rank of the world?"""
        flat = [p.detach().reshape(-1) for p in state.model.parameters()]
        mine = torch.cat([part for p in flat for part in (p[:4096], p[-4096:])])
        everyone = [torch.zeros_like(mine) for _ in range(state.world_size)]
        dist.all_gather(everyone, mine)
        return all(torch.equal(other, mine) for other in everyone)

    @elastic.run
    def loop(state) -> dict[str, Any]:
        rank, size = state.rank, state.world_size
        log(
            event="enter",
            step=state.step,
            rank=rank,
            size=size,
            equal=identical(),
            host=os.environ["SPARKDIST_TASK_HOST"],
        )
        ddp = torch.nn.parallel.DistributedDataParallel(state.model, init_sync=init_sync)
        loader = state.loader if train is not None else None
        batches = iter(loader) if loader is not None else None
        while not _stop_agreed(rank, state.step, min_steps, max_steps, stop_file):
            read: dict[str, Any] = {}
            if batches is not None:
                ids, read = _world_batch(batches, loader, size)
                xb, yb = x[ids % len(x)], y[ids % len(x)]
            else:
                start = ((state.step * size + rank) * 16) % (len(x) - 16)
                xb, yb = x[start : start + 16], y[start : start + 16]
            state.optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(xb).squeeze(1), yb)
            loss.backward()
            state.optimizer.step()
            state.step += 1
            if rank == 0:
                _append_line(
                    steps_file,
                    {
                        "step": state.step,
                        "world_size": size,
                        "generation": state.generation,
                        "at": time.time(),
                        **read,
                    },
                )
            log(event="stepped", step=state.step)
            state.commit()
            time.sleep(step_s)
        with torch.no_grad():
            final = float(torch.nn.functional.mse_loss(state.model(x).squeeze(1), y))
        return {
            "launch": launch,
            "pid": pid,
            "rank": rank,
            "size": size,
            "generation": state.generation,
            "step": state.step,
            "loss": final,
            "equal": identical(),
            "host": os.environ["SPARKDIST_TASK_HOST"],
        }

    try:
        return loop(state)
    finally:
        cleanup.close()


def run_horovod_elastic(
    spark, progress_dir: str, steps: int, step_s: float = 0.4, num_proc: int = 3
) -> dict[str, Any]:
    """Horovod's own Spark integration of elastic mode (`horovod.spark.run_elastic`, Gloo)
    on `elastic_main`'s kind of loop with `hvd.elastic.run` and a commit every step; rank 0
    appends (step, world size) to `progress_dir/steps.jsonl`, every rank logs each entry
    of its training function (pid, rank, size) to `progress_dir/events-<pid>.jsonl`.
    Reports success or the failure."""
    import horovod.spark

    def train(progress_dir: str, steps: int, step_s: float) -> int:
        import json
        import os
        import time

        import horovod.torch as hvd
        import torch

        def append(path: str, row: dict) -> None:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(fd, (json.dumps(row) + "\n").encode())
            os.close(fd)

        hvd.init()
        torch.manual_seed(0)
        x = torch.randn(240, 8)
        y = x @ torch.arange(1.0, 9.0) + 0.5
        model = torch.nn.Linear(8, 1)
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9),
            named_parameters=model.named_parameters(),
        )
        state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)
        events = os.path.join(progress_dir, f"events-{os.getpid()}.jsonl")

        @hvd.elastic.run
        def loop(state) -> int:
            rank, size = hvd.rank(), hvd.size()
            append(
                events,
                {
                    "event": "enter",
                    "pid": os.getpid(),
                    "rank": rank,
                    "size": size,
                    "step": state.step,
                    "at": time.time(),
                },
            )
            while state.step < steps:
                start = ((state.step * size + rank) * 16) % (len(x) - 16)
                optimizer.zero_grad()
                out = model(x[start : start + 16]).squeeze(1)
                torch.nn.functional.mse_loss(out, y[start : start + 16]).backward()
                optimizer.step()
                state.step += 1
                if rank == 0:
                    append(
                        os.path.join(progress_dir, "steps.jsonl"),
                        {"step": state.step, "world_size": size, "at": time.time()},
                    )
                append(
                    events,
                    {"event": "stepped", "pid": os.getpid(), "step": state.step, "at": time.time()},
                )
                state.commit()
                time.sleep(step_s)
            return size

        return loop(state)

    out: dict[str, Any] = {"ok": False}
    try:
        values = horovod.spark.run_elastic(
            train,
            args=(progress_dir, steps, step_s),
            num_proc=num_proc,
            min_num_proc=2,
            max_num_proc=num_proc,
            start_timeout=120,
            elastic_timeout=120,
            verbose=1,
        )
        out["value"] = values
        out["ok"] = True
    except Exception as exc:  # noqa: BLE001 - reported to the caller
        out["failed_at"] = time.time()
        out["error_type"] = type(exc).__name__
        out["error"] = str(exc)
    return out


def warm_up(spark, tasks: int = 3) -> int:
    """A small Spark job of `tasks` tasks, so that every executor has its Python worker
    running before a job's tasks arrive (a gang seats the tasks that arrive together)."""
    sc = spark.sparkContext
    return len(set(sc.parallelize(range(tasks), tasks).map(lambda _: os.getpid()).collect()))
