"""Check 11 of `make gpu-check`: a job's trace holds each rank's GPU counters where
CUDA is in use (memory allocated and reserved, sampled with the signs of life, and
utilisation where NVML answers), and none on the CPU (issue 63)."""

from __future__ import annotations

import json

import sparkdist
from sparkdist.trace import validate

MIB = 256
"""The tensor each rank holds on the GPU while it steps: the counter must show it."""


def stepping_main(device: str) -> int:
    """Hold a tensor of `MIB` MiB on `device` and report steps for about 2.5 s, so that
    its signs of life (once a second) carry a few samples."""
    import time

    import torch

    import sparkdist

    held = torch.ones(MIB * 2**20 // 4, device=device)
    for step in range(50):
        time.sleep(0.05)
        sparkdist.report({"sum": float(held[:1].sum())}, step=step)
    return int(torch.cuda.is_initialized())


def check_trace(device: str) -> str:
    runner = sparkdist.HorovodRunner(np=-1, launcher="direct")
    runner.run(stepping_main, device=device)
    with open(runner.last_job.trace) as f:
        trace = json.load(f)
    validate.check(trace)
    memory = [e["args"] for e in trace["traceEvents"] if e["name"] == "gpu memory"]
    used = [e["args"] for e in trace["traceEvents"] if e["name"] == "gpu utilisation"]
    if device == "cpu":
        if memory or used:
            raise AssertionError(f"GPU counters in a CPU job's trace: {memory[:2]} {used[:2]}")
        return "no GPU counter in a CPU job's trace"
    if not memory:
        raise AssertionError("no gpu memory counter in a CUDA job's trace")
    peak = max(m["allocated_mib"] for m in memory)
    if peak < MIB:
        raise AssertionError(f"gpu memory counter peaks at {peak:.0f} MiB, under {MIB} MiB")
    nvml = f", utilisation {len(used)} samples" if used else ", no NVML: no utilisation"
    return f"{len(memory)} memory samples, peak {peak:.0f} MiB allocated{nvml}"
