"""What the ranks of `gpu_check.py`'s jobs run (checks 1, 3, 4, 6 and 7), and the driver
side of each check: one function per check, returning its figure or raising.

Every job runs on the driver (`HorovodRunner(np=-k, launcher="direct")`): no Java, no
pyspark. `device` is "cpu" (the plumbing, on any machine) or "cuda".
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import sparkdist

# --- 1. DDP: NCCL one rank, gloo with CUDA tensors two ranks, equal to the CPU run ---------


def ddp_main(device: str, backend: str, steps: int = 3) -> list[float]:
    """Train a float64 MLP with DDP for `steps` steps; its parameters, flat."""
    import torch
    import torch.distributed as dist

    if device == "cuda":
        torch.cuda.set_device(0)  # one GPU: every rank on it, set before the group forms
    dist.init_process_group(backend)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    model = model.double().to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(steps):
        generator = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(32, 8, generator=generator, dtype=torch.float64).to(device)
        optimizer.zero_grad()
        ddp(x).pow(2).mean().backward()
        optimizer.step()
    flat = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()]).tolist()
    dist.destroy_process_group()
    return flat


def ddp_params(np: int, device: str, backend: str) -> list[list[float]]:
    """Every rank's parameters after a DDP job of `np` ranks."""
    return sparkdist.HorovodRunner(np=-np, launcher="direct").run_all(
        ddp_main, device=device, backend=backend
    )


def _max_difference(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def check_ddp(np: int, device: str, backend: str) -> str:
    """DDP on `device` over `backend` with `np` ranks against gloo on CPU."""
    reference = ddp_params(np, "cpu", "gloo")
    if any(r != reference[0] for r in reference):
        raise AssertionError("the CPU run's ranks disagree")
    if device == "cpu":
        return f"{len(reference[0])} parameters equal on {np} ranks"
    got = ddp_params(np, device, backend)
    worst = max(_max_difference(g, reference[0]) for g in got)
    if worst > 1e-9:
        raise AssertionError(f"{device}/{backend} differs from CPU by {worst:.3g}")
    return f"max |{device} - cpu| = {worst:.2g} (float64)"


# --- 3. ShardedTorchState (FSDP2): rebuilt from memory and from its sharded checkpoint ------


def fsdp_build(device: str):
    """The model and optimizer `ShardedTorchState` builds in each world: an MLP sharded
    with FSDP2 over a mesh of `device`."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device, (dist.get_world_size(),))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    model = model.to(device)
    fully_shard(model[0], mesh=mesh)
    fully_shard(model[2], mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def fsdp_loss(state, device: str, step: int, train: bool = True) -> float:
    import torch

    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1000 + step)).to(device)
    if not train:
        with torch.no_grad():
            return float(state.model(x).pow(2).mean())
    loss = state.model(x).pow(2).mean()
    loss.backward()
    state.optimizer.step()
    state.optimizer.zero_grad()
    return float(loss)


def enter_world(state, number: int, backend: str, port: int) -> None:
    """Form world `number` of every rank of the job (as `elastic.run` does on entry, with
    the job's own rank numbers), and sync the state into it."""
    import datetime

    import torch.distributed as dist

    from sparkdist.elastic.generations import Generation
    from sparkdist.elastic.torch_group import TorchGroup

    if dist.is_initialized():
        dist.destroy_process_group()
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(
        "127.0.0.1", port, size, is_master=rank == 0, timeout=datetime.timedelta(seconds=60)
    )
    dist.init_process_group(backend, store=store, rank=rank, world_size=size)
    state._group = TorchGroup(Generation(number, tuple(range(size))), rank, backend, store)
    state.sync()


def fsdp_main(device: str, backend: str, ports: list[int]) -> dict:
    """Commit 3 steps (the 2nd saved as a sharded checkpoint), lose a step, re-form: the
    loss on a fixed batch is the commit's again, from memory; a fresh state (nothing in
    memory) gets commit 2's from storage."""
    import functools

    from sparkdist import elastic

    if device == "cuda":
        import torch

        torch.cuda.set_device(0)
    build = functools.partial(fsdp_build, device)
    state = elastic.ShardedTorchState(build, save_every=2, step=0)
    enter_world(state, 0, backend, ports[0])
    losses = {}
    for step in range(1, 4):
        fsdp_loss(state, device, step)
        state.step = step
        state.commit()
        losses[step] = fsdp_loss(state, device, 99, train=False)
    fsdp_loss(state, device, 4)  # a step past the commit: lost
    state.restore()
    enter_world(state, 1, backend, ports[1])
    memory = (state.restored_from, state.step, fsdp_loss(state, device, 99, train=False))
    fresh = elastic.ShardedTorchState(build, save_every=2, step=0)
    enter_world(fresh, 2, backend, ports[2])
    storage = (fresh.restored_from, fresh.step, fsdp_loss(fresh, device, 99, train=False))
    where = {p.device.type for p in fresh.model.parameters()}
    import torch.distributed as dist

    dist.destroy_process_group()
    return {"losses": losses, "memory": memory, "storage": storage, "where": sorted(where)}


def free_ports(count: int) -> list[int]:
    import socket

    ports = []
    for _ in range(count):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    return ports


def check_fsdp(np: int, device: str, backend: str, store: Path) -> str:
    runner = sparkdist.HorovodRunner(np=-np, launcher="direct", checkpoint_dir=str(store))
    results = runner.run_all(fsdp_main, device=device, backend=backend, ports=free_ports(3))
    for result in results:
        losses = result["losses"]
        for where, step in (("memory", 3), ("storage", 2)):
            source, restored, loss = result[where]
            if (source, restored) != (where, step) or not math.isclose(loss, losses[step]):
                raise AssertionError(f"from {where}: {result[where]}, committed {losses[step]}")
        if result["where"] != [device]:
            raise AssertionError(f"parameters on {result['where']}, not {device}")
    return f"loss {results[0]['losses'][3]:.6f} rebuilt exactly, {np} rank(s)"


# --- 4. sharded DCP checkpoints of CUDA tensors: saved, resharded, loaded -------------------


def _full(rows: int = 12, cols: int = 6):
    import torch

    return torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols)


def dcp_main(device: str, backend: str, dim: int, save_step: int | None) -> dict:
    """This world's DTensors of `_full()` sharded on `dim` over a mesh of `device`: resume
    the newest checkpoint into them if there is one, then save `save_step` if given."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from sparkdist import checkpoint

    if device == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group(backend)
    size, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh(device, (size,))
    local = _full().to(device).chunk(size, dim=dim)[rank].contiguous()
    resumed = None
    state = {"w": DTensor.from_local(torch.zeros_like(local), mesh, [Shard(dim)], run_check=False)}
    found = checkpoint.resume(into=state)
    if found is not None:
        got = state["w"].to_local()
        resumed = {
            "step": found.step,
            "from": found.world_size,
            "device": got.device.type,
            "same": bool(torch.equal(got.cpu(), local.cpu())),
        }
    if save_step is not None:
        tensor = DTensor.from_local(local, mesh, [Shard(dim)], run_check=False)
        checkpoint.save({"w": tensor}, save_step, sharded=True)
    dist.destroy_process_group()
    return {"resumed": resumed}


def check_dcp(np: int, device: str, backend: str, store: Path) -> str:
    """`np` ranks save rows-sharded; one rank loads it whole; on CUDA `np` ranks also load
    it sharded by columns (resharded both ways)."""

    def job(ranks: int, dim: int, save_step: int | None) -> list[dict]:
        runner = sparkdist.HorovodRunner(np=-ranks, launcher="direct", checkpoint_dir=str(store))
        return runner.run_all(
            dcp_main, device=device, backend=backend, dim=dim, save_step=save_step
        )

    job(np, 0, 1)
    loads = ((1, 0), (np, 1)) if device == "cuda" else ((1, 0),)  # CPU: the plumbing, quick
    for ranks, dim in loads:
        for result in job(ranks, dim, None):
            resumed = result["resumed"]
            expected = {"step": 1, "from": np, "device": device, "same": True}
            if resumed != expected:
                raise AssertionError(f"{ranks} rank(s), dim {dim}: {resumed}")
    loaded = " and ".join(f"{ranks} rank(s) on dim {dim}" for ranks, dim in loads)
    return f"saved by {np} ranks on dim 0, loaded by {loaded}"


# --- 6. CUDA_VISIBLE_DEVICES and local-rank pinning: two ranks on a one-GPU driver ---------


def pinning_main() -> dict:
    import torch

    from sparkdist.backends.gpu import torch_process_group_backend

    found = {
        key: os.environ.get(key)
        for key in ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "CUDA_DEVICE_ORDER")
    }
    if torch.cuda.is_available():
        tensor = torch.ones(4, device="cuda") * (int(os.environ["LOCAL_RANK"]) + 1)
        found["count"] = torch.cuda.device_count()
        found["sum"] = float(tensor.sum())
        found["backend"] = torch_process_group_backend()
    return found


def check_pinning(cuda: bool) -> str:
    """The driver's GPU "0" (as Spark would give it: `SPARKDIST_TASK_GPUS`) shared by two
    ranks: each sees exactly that GPU, and can use it."""
    from sparkdist import job_environment

    runner = sparkdist.HorovodRunner(np=-2, launcher="direct", env={job_environment.TASK_GPUS: "0"})
    results = runner.run_all(pinning_main)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    expected = visible.split(",")[0].strip() if visible else "0"
    for rank, found in enumerate(results):
        if (found["CUDA_VISIBLE_DEVICES"], found["LOCAL_RANK"]) != (expected, str(rank)):
            raise AssertionError(f"rank {rank}: {found}")
        if found["CUDA_DEVICE_ORDER"] != "PCI_BUS_ID":
            raise AssertionError(f"rank {rank}: {found}")
        if cuda and (found["count"], found["sum"], found["backend"]) != (
            1,
            4.0 * (rank + 1),
            "nccl",
        ):
            raise AssertionError(f"rank {rank} on the GPU: {found}")
    return f"both ranks see CUDA_VISIBLE_DEVICES={expected}" + (", one device each" if cuda else "")


# --- 7. the NCCL flight recorder, and a communicator aborted mid-collective (one rank) ------

KERNEL_S = 12.0
"""How long the kernel the aborted all_reduce is queued behind runs: the abort must return
the wait long before it ends."""
ABORT_RETURNS_S = 3.0
"""The most an abort may take to return the blocked wait (a small share of `KERNEL_S`)."""


def _cycles_per_second():
    """The GPU's clock, measured: cycles of `torch.cuda._sleep` per second."""
    import torch

    cycles = int(2e8)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) / 1000.0)


def nccl_main() -> dict:
    """One NCCL rank: collectives show in the flight recorder's dump; then an all_reduce
    queued behind a kernel of `KERNEL_S` seconds, its wait blocking this thread
    (`TORCH_NCCL_BLOCKING_WAIT`), is aborted from another thread the way `elastic.run`'s
    watcher aborts a world (`TorchGroup.abort`). The figures: how long after the abort
    began the wait returned, whether the kernel was still running then, and what a
    collective on the aborted communicator does."""
    import datetime
    import pickle
    import threading
    import time

    import torch
    import torch.distributed as dist

    from sparkdist.elastic.generations import Generation
    from sparkdist.elastic.torch_group import TorchGroup

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    tensor = torch.ones(1 << 20, device="cuda")
    for _ in range(3):
        dist.all_reduce(tensor)
    torch.cuda.synchronize()
    trace = pickle.loads(torch._C._distributed_c10d._dump_nccl_trace())
    names = sorted({str(entry.get("profiling_name")) for entry in trace.get("entries", [])})
    rate = _cycles_per_second()
    torch.cuda._sleep(int(rate * KERNEL_S))  # the GPU busy: the next collective waits
    kernel_done = torch.cuda.Event()
    kernel_done.record()
    queued = time.monotonic()
    work = dist.all_reduce(tensor, async_op=True)
    abort_began = []

    def abort() -> None:
        abort_began.append(time.monotonic())
        TorchGroup(Generation(0, (0,)), 0, "nccl").abort()
        abort_began.append(time.monotonic())

    aborter = threading.Timer(1.0, abort)  # once this thread is blocked in the wait
    aborter.start()
    try:
        work.wait()
        outcome = "wait returned"
    except Exception as exc:  # noqa: BLE001 - what the wait does after an abort is the figure
        outcome = f"wait raised {type(exc).__name__}"
    returned = time.monotonic()
    kernel_running = not kernel_done.query()
    aborter.join()
    try:  # the communicator after the abort: a collective must not work on it
        again = dist.all_reduce(torch.ones(1, device="cuda"), async_op=True)
        again.wait(datetime.timedelta(seconds=10))
        after = "a collective worked"
    except Exception as exc:  # noqa: BLE001 - the refusal is the figure
        after = f"a collective raised {type(exc).__name__}"
    return {
        "names": names,
        "entries": len(trace.get("entries", [])),
        "kernel_s": KERNEL_S,
        "queued_s": abort_began[0] - queued,
        "abort_s": abort_began[1] - abort_began[0],
        "returned_s": returned - abort_began[0],
        "kernel_running": kernel_running,
        "outcome": outcome,
        "after": after,
    }


def check_nccl() -> str:
    runner = sparkdist.HorovodRunner(
        np=-1,
        launcher="direct",
        env={"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_BLOCKING_WAIT": "1"},
    )
    found = runner.run(nccl_main)
    if not any("all_reduce" in name for name in found["names"]):
        raise AssertionError(f"no all_reduce in the flight recorder: {found}")
    if found["returned_s"] >= ABORT_RETURNS_S or not found["kernel_running"]:
        raise AssertionError(
            f"the abort did not return the wait before its {KERNEL_S:.0f} s kernel ended "
            f"(under {ABORT_RETURNS_S:.0f} s): {found}"
        )
    if found["after"] == "a collective worked":
        raise AssertionError(f"the aborted communicator still works: {found}")
    return (
        f"recorder: {found['entries']} entries; abort {found['abort_s']:.2f} s, "
        f"{found['outcome']} {found['returned_s']:.2f} s after it began, "
        f"its {KERNEL_S:.0f} s kernel still running; then {found['after']}"
    )
