"""Checkpoint saves at model scale: a 1 GB state (250M fp32 parameters) on 2 ranks.

On real Spark (local-cluster[2,1,1024]), one HorovodRunner job (np=2) per way of saving,
each taking SAVES saves of the same state between "training steps" (an in-place update
of every local tensor):

* driver path (today's `checkpoint.save`): rank 0 holds the whole state, as in data
  parallel training, and sends it pickled to the driver, which writes it;
* sharded sync (`checkpoint.save(state, step)` with a DTensor state): every rank writes
  its 500 MB shard with torch.distributed.checkpoint, rank 0 commits to the driver;
* sharded async (`async_save=True`): the same, written from a background thread;
* plain DCP (`torch.distributed.checkpoint.save` called directly): the floor.

Per save: seconds until the checkpoint is complete (committed), and the training stall:
how long the ranks are held before the next step (for async, until `save` returns plus
a barrier). The driver's peak RSS is sampled (every 20 ms) in this process, which runs
the job's driver service, and shown above its level before the job.

    .venv/bin/python benchmarks/checkpoint_save.py [--params 250_000_000] [--saves 3]

Memory: about 4 GB at the peak (the driver path's rank 0 holds the state and its
pickle). Prints one table; not part of `make test`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import threading
import time

import bench_table  # a sibling script, not a package
import psutil

TENSORS = 25


def bench_main(mode: str, params: int, saves: int, directory: str) -> dict:
    """One rank: build the state, then `saves` rounds of step + save; rank 0's timings."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from sparkdist import checkpoint

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    per_tensor = params // TENSORS
    if mode == "driver path":  # data parallel: every rank holds everything; rank 0 saves
        local = [torch.rand(per_tensor) for _ in range(TENSORS)] if rank == 0 else []
        state = {f"layer{i}": t for i, t in enumerate(local)}
    else:
        mesh = init_device_mesh("cpu", (world,))
        local = [torch.rand(per_tensor // world) for _ in range(TENSORS)]
        state = {f"layer{i}": DTensor.from_local(t, mesh, [Shard(0)]) for i, t in enumerate(local)}
    rows = []
    for step in range(1, saves + 1):
        for tensor in local:  # the training step
            tensor.mul_(0.999)
        dist.barrier()
        started = time.perf_counter()
        if mode == "plain DCP":
            dcp.save(state, checkpoint_id=os.path.join(directory, f"plain-{step}"))
        elif mode == "sharded async":
            checkpoint.save(state, step, async_save=True)
        else:
            checkpoint.save(state, step)
        dist.barrier()
        stall = time.perf_counter() - started
        checkpoint.wait()
        dist.barrier()
        rows.append({"seconds": time.perf_counter() - started, "stall": stall})
        if mode == "plain DCP" and rank == 0 and step > 2:
            shutil.rmtree(os.path.join(directory, f"plain-{step - 2}"))
    dist.destroy_process_group()
    return {"rows": rows, "steps": checkpoint.committed_steps() if rank == 0 else []}


class PeakRss:
    """This process's peak RSS while the block runs (sampled every 20 ms)."""

    def __enter__(self):
        self.process = psutil.Process()
        self.base = self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def run_mode(mode: str, params: int, saves: int) -> dict:
    import sparkdist

    directory = tempfile.mkdtemp(prefix="sparkdist-bench-ckpt-")
    env = {"SPARKDIST_CHECKPOINT_DRIVER_LIMIT_MB": str(8 * params * 4 // 2**20)}
    runner = sparkdist.HorovodRunner(np=2, checkpoint_dir=directory, env=env, timeout=1800)
    try:
        with PeakRss() as rss:
            result = runner.run(
                bench_main, mode=mode, params=params, saves=saves, directory=directory
            )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    rows = result["rows"]
    return {
        "mode": mode,
        "seconds": statistics.median(r["seconds"] for r in rows),
        "stall": statistics.median(r["stall"] for r in rows),
        "rss_mib": rss.peak / 2**20,
        "rss_over_mib": (rss.peak - rss.base) / 2**20,
        "committed": result["steps"],
    }


def print_saves(results: list[dict], floor: float, sync: float, args) -> None:
    """Each way of saving: seconds and stall per save, against plain DCP and the sync save,
    the driver's peak memory."""
    lines = [
        f"{'way of saving':<16} {'s/save':>8} {'stall/save':>11} {'vs plain DCP':>13} "
        f"{'stall/sync':>11} {'driver peak RSS':>16} {'(+ over start)':>15}"
    ]
    for r in results:
        lines.append(
            f"{r['mode']:<16} {r['seconds']:>8.2f} {r['stall']:>11.2f} "
            f"{r['seconds'] / floor:>12.2f}x {r['stall'] / sync:>10.0%} "
            f"{r['rss_mib']:>12.0f} MiB {r['rss_over_mib']:>11.0f} MiB"
        )
    columns = [
        "way of saving",
        "s/save",
        "stall/save s",
        "vs plain DCP",
        "stall/sync",
        "driver peak RSS MiB",
        "+ over start MiB",
    ]
    cells = [
        [
            r["mode"],
            r["seconds"],
            r["stall"],
            r["seconds"] / floor,
            r["stall"] / sync,
            r["rss_mib"],
            r["rss_over_mib"],
        ]
        for r in results
    ]
    title = f"{args.params:,} fp32 parameters on 2 ranks, {args.saves} saves per way; medians"
    bench_table.print_table("saves", title, columns, cells, text="\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=250_000_000)
    parser.add_argument("--saves", type=int, default=3)
    args = parser.parse_args()

    from sparkdist.spark.session import embedded_spark

    embedded_spark(executors=2, app_name="checkpoint-bench", master="local-cluster[2,1,1024]")
    gib = args.params * 4 / 2**30
    print(
        f"state: {args.params:,} fp32 parameters ({gib:.2f} GiB) on 2 ranks, "
        f"{args.saves} saves per way; medians",
        flush=True,
    )
    results = []
    for mode in ("driver path", "sharded sync", "sharded async", "plain DCP"):
        row = run_mode(mode, args.params, args.saves)
        print(f"  {mode}: {row}", flush=True)
        results.append(row)
    by_mode = {r["mode"]: r for r in results}
    floor, sync = by_mode["plain DCP"]["seconds"], by_mode["sharded sync"]["seconds"]
    print()
    print_saves(results, floor, sync, args)
    print()
    print(
        f"goals: sharded sync within 1.1x of plain DCP: "
        f"{sync / floor:.2f}x; async stall under 10% of the sync save: "
        f"{by_mode['sharded async']['stall'] / sync:.0%}; driver RSS unchanged by the "
        f"state's size: sharded +{by_mode['sharded sync']['rss_over_mib']:.0f} MiB / "
        f"+{by_mode['sharded async']['rss_over_mib']:.0f} MiB, driver path "
        f"+{by_mode['driver path']['rss_over_mib']:.0f} MiB"
    )


if __name__ == "__main__":
    main()
