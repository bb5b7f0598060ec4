"""Check 10 of `make gpu-check` (issue 50): a warm world on a GPU keeps its CUDA context
and what a module holds on the device, and gives back what a run left in torch's cache.

Run 1 (cold) starts the rank, forms a process group (NCCL on CUDA, gloo on CPU), keeps
a tensor in a module and leaves a large temporary tensor and its process group behind.
Run 2 on the same world must find the same process, the kept tensor still on the device,
the temporary tensor's blocks given back (`torch.cuda.memory_reserved` no more than the
kept tensor and some slack) and a new process group that works. The figure: run 1's
and run 2's wall times.
"""

from __future__ import annotations

import time

KEPT_MB = 256
TEMPORARY_MB = 1024
SLACK_MB = 64
"""What else torch may keep reserved on the device after a run (the allreduce's blocks)."""


def warm_main(device: str) -> dict:
    """One run: a process group, an all_reduce, a kept tensor and a temporary one."""
    import os
    import sys
    import types

    import torch
    import torch.distributed as dist

    if device == "cuda":
        torch.cuda.set_device(0)
    reserved_at_start = torch.cuda.memory_reserved() if device == "cuda" else 0
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    value = torch.ones(1, device=device)
    dist.all_reduce(value)
    kept = sys.modules.setdefault("gpu_check_warm_state", types.ModuleType("gpu_check_warm_state"))
    first = not hasattr(kept, "tensor")
    if first:
        kept.tensor = torch.ones(KEPT_MB * 2**18, device=device)  # float32: KEPT_MB MiB
        temporary = torch.ones(TEMPORARY_MB * 2**18, device=device)
        kept.temporary_sum = float(temporary.sum().item())
        # the process group and `temporary`'s blocks are left for sparkdist to free
    else:
        dist.destroy_process_group()
    return {
        "pid": os.getpid(),
        "first": first,
        "reduced": value.item(),
        "kept_device": str(kept.tensor.device),
        "kept_sum": float(kept.tensor.sum().item()),
        "reserved_at_start_mb": reserved_at_start / 2**20,
    }


def check_warm(device: str) -> str:
    """Two runs on one warm world of one rank on the driver; raise AssertionError when
    run 2 did not find run 1's process, kept tensor and freed cache."""
    from sparkdist import HorovodRunner

    with HorovodRunner(np=-1, launcher="direct", keep_warm=120) as runner:
        began = time.monotonic()
        one = runner.run(warm_main, device=device)
        cold_s = time.monotonic() - began
        began = time.monotonic()
        two = runner.run(warm_main, device=device)
        warm_s = time.monotonic() - began
    if not one["first"] or two["first"] or one["pid"] != two["pid"]:
        raise AssertionError(f"run 2 is not in run 1's process with its module: {one} {two}")
    expected_sum = float(KEPT_MB * 2**18)
    if two["kept_sum"] != expected_sum or two["reduced"] != 1.0:
        raise AssertionError(f"run 2's kept tensor or all_reduce is wrong: {two}")
    if device == "cuda":
        if not two["kept_device"].startswith("cuda"):
            raise AssertionError(f"the kept tensor left the GPU: {two}")
        if two["reserved_at_start_mb"] > KEPT_MB + SLACK_MB:
            raise AssertionError(
                f"run 1's temporary {TEMPORARY_MB} MiB still reserved at run 2's start: {two}"
            )
    reserved = (
        f", reserved at run 2 {two['reserved_at_start_mb']:.0f} MiB" if device == "cuda" else ""
    )
    return f"cold {cold_s:.2f} s, warm {warm_s:.3f} s, same pid{reserved}"
