"""What in-process elastic FSDP2 costs: a `ShardedTorchState` commit, with and without the
neighbour copy, and the rebuilding of the state in a smaller world from memory.

Three spawned rank processes (gloo, CPU) against a real `DriverService`, with an FSDP2 MLP
of about `--params` parameters (Adam: its state is three times that). Each commits
`--commits` times with neighbour copies, then as many without; then rank 2 ends and ranks
0 and 1 form a world of two, rebuilding the sharded state from their memory.

    .venv/bin/python benchmarks/elastic_fsdp_commit.py [--params 10e6]

Prints one table. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import bench_table  # noqa: E402 (a sibling script, not a package)

WIDTH = 1024


def _build(params: float):
    import torch
    from torch.distributed.fsdp import fully_shard

    layers = max(1, round(params / (WIDTH * WIDTH)))
    model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.Adam(model.parameters(), lr=1e-4)


def _rank(launch: int, world_size: int, address: str, secret: str, extra) -> None:
    from driver_peers import connect_rank
    from elastic_worlds import enter_world

    from sparkdist import elastic

    params, commits, ports, results = extra
    connect_rank(launch, world_size, address, secret)
    state = elastic.ShardedTorchState(lambda: _build(params), save_every=10**9, step=0)
    enter_world(state, 0, (0, 1, 2), launch, ports[0])
    times = {}
    for copies in (True, False):
        state.neighbour_copy, took = copies, []
        for _ in range(commits):
            began = time.perf_counter()
            state.commit()
            took.append(time.perf_counter() - began)
        times[copies] = statistics.median(took)
    state.neighbour_copy = True
    state.commit()
    if launch == 2:
        results.put((launch, times, None))
        return
    state.restore()
    began = time.perf_counter()
    enter_world(state, 1, (0, 1), launch, ports[1])
    results.put((launch, times, (state.restored_from, time.perf_counter() - began)))


def main() -> None:
    from driver_peers import SpawnedRanks
    from helpers import free_port

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=10e6)
    parser.add_argument("--commits", type=int, default=5)
    args = parser.parse_args()
    results = multiprocessing.get_context("spawn").Queue()
    ports = [free_port() for _ in range(2)]
    ranks = SpawnedRanks(3, _rank, (args.params, args.commits, ports, results))
    try:
        got = {
            launch: (times, rebuilt)
            for launch, times, rebuilt in (results.get(timeout=600) for _ in range(3))
        }
    finally:
        ranks.close()
    layers = max(1, round(args.params / (WIDTH * WIDTH)))
    shard_mb = layers * (WIDTH * WIDTH + WIDTH) * 4 * 3 / 3 / 2**20  # params + 2 moments
    with_copy = max(times[True] for times, _ in got.values())
    without = max(times[False] for times, _ in got.values())
    source, rebuild_s = got[0][1]
    params = layers * (WIDTH * WIDTH + WIDTH)
    lines = [
        "| model | shard per rank | commit | commit + neighbour copy | 3 -> 2 rebuild |",
        "| --- | --- | --- | --- | --- |",
        f"| {params / 1e6:.0f}M params, Adam | {shard_mb:.0f} MB "
        f"| {without * 1000:.0f} ms | {with_copy * 1000:.0f} ms | {rebuild_s:.2f} s "
        f"(from {source}) |",
    ]
    columns = [
        "parameters",
        "shard per rank MB",
        "commit ms",
        "commit + neighbour copy ms",
        "3 -> 2 rebuild s",
        "rebuilt from",
    ]
    cells = [[params, shard_mb, without * 1000, with_copy * 1000, rebuild_s, str(source)]]
    title = "In-process elastic FSDP2: a commit, with and without the neighbour copy; 3 -> 2"
    bench_table.print_table("commit", title, columns, cells, text="\n".join(lines))


if __name__ == "__main__":
    main()
