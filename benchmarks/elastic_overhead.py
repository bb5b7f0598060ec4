"""What the in-process elastic machinery costs a step when nothing goes wrong (issue 64's
goal: at most 3 % of the step time, against the same job without `sparkdist.elastic`).

The same 2-rank DDP job (an MLP, `--hidden` wide, Adam, batches of `--batch` rows, one
BLAS thread a rank) runs on a local-cluster[2,1,1024] Spark in these ways, one warm-up job
each, then `--rounds` rounds in which every way runs once (the order rotating round by
round, so that a slow spell of a shared machine does not fall on one way):

* **plain**: `HorovodRunner(np=2)`, `init_process_group("gloo")`, DDP, a
  `sparkdist.report` a step: the floor;
* **elastic, commit every step**: `HorovodRunner(np=2, min_np=1, max_np=2)`,
  `@elastic.run` with a `TorchState` of the model and optimizer, `state.commit()` after
  every step (an in-memory copy of both), the same report; the driver's membership
  service, the ranks' watcher threads and signs of life and the stall watch all run;
* **elastic, commit every 10 steps**: the same, committing every 10th step (what the
  docs advise for a model whose copy is not small against a step);
* **elastic, no commit**: the same, never committing: the watch and the world alone.

Each rank times its own loop after `--warmup` steps (`time.perf_counter`: launch and
process-group set-up stay out); the table gives rank 0's and the slowest rank's ms per
step, medians and min-max over the rounds, and each way against plain. What one commit
costs (the copy) is timed apart, in this process, for the same model.

    .venv/bin/python benchmarks/elastic_overhead.py [--rounds 5] [--steps 300] [--hidden 1024]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_table  # noqa: E402 (a sibling script, not a package)

ONE_THREAD = {name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
WAYS = (
    "plain",
    "elastic, commit every step",
    "elastic, commit every 10 steps",
    "elastic, no commit",
)


def build(hidden: int, batch: int):
    """The model, its optimizer and a fixed batch (the same on every rank and run)."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, 64), torch.randint(0, 10, (batch,))
    return model, optimizer, x, y


def one_step(ddp, optimizer, x, y) -> float:
    import torch

    loss = torch.nn.functional.cross_entropy(ddp(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def plain_job(steps: int, warmup: int, hidden: int, batch: int) -> tuple[float, float]:
    """Wall and CPU seconds a step on this rank (the process's CPU, its threads' too),
    after `warmup` steps: DDP on a fixed world."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import sparkdist

    dist.init_process_group("gloo")
    model, optimizer, x, y = build(hidden, batch)
    ddp = DistributedDataParallel(model)
    for step in range(steps):
        if step == warmup:
            started, cpu = time.perf_counter(), time.process_time()
        sparkdist.report({"loss": one_step(ddp, optimizer, x, y)}, step=step)
    timed = steps - warmup
    seconds = ((time.perf_counter() - started) / timed, (time.process_time() - cpu) / timed)
    dist.destroy_process_group()
    return seconds


def elastic_job(
    steps: int, warmup: int, hidden: int, batch: int, every: int
) -> tuple[float, float]:
    """The same loop in `@elastic.run`, committing every `every` steps (0: never)."""
    from torch.nn.parallel import DistributedDataParallel

    import sparkdist
    from sparkdist import elastic

    model, optimizer, x, y = build(hidden, batch)
    state = elastic.TorchState(model=model, optimizer=optimizer, step=0)
    clock = {}

    @elastic.run
    def train(state):
        ddp = DistributedDataParallel(state.model)
        while state.step < steps:
            if state.step == warmup:
                clock["started"], clock["cpu"] = time.perf_counter(), time.process_time()
            loss = one_step(ddp, state.optimizer, x, y)
            sparkdist.report({"loss": loss}, step=state.step)
            state.step += 1
            if every and state.step % every == 0:
                state.commit()
        timed = steps - warmup
        return (
            (time.perf_counter() - clock["started"]) / timed,
            (time.process_time() - clock["cpu"]) / timed,
        )

    return train(state)


def run_way(way: str, steps: int, warmup: int, hidden: int, batch: int) -> list[tuple]:
    """Every rank's (wall, CPU) seconds a step for one job of `way`."""
    from sparkdist import HorovodRunner

    args = {"steps": steps, "warmup": warmup, "hidden": hidden, "batch": batch}
    if way == "plain":
        return HorovodRunner(np=2, env=ONE_THREAD).run_all(plain_job, **args)
    every = {"elastic, commit every step": 1, "elastic, commit every 10 steps": 10}.get(way, 0)
    runner = HorovodRunner(np=2, min_np=1, max_np=2, env=ONE_THREAD)
    seconds = runner.run_all(elastic_job, every=every, **args)
    if runner.last_job.failures:
        raise AssertionError(
            f"{way}: the world changed in a fault-free run: {runner.last_job.failures}"
        )
    return seconds


def commit_cost_ms(hidden: int, batch: int, repeat: int = 20) -> float:
    """One `commit()`'s copy of this model and its Adam state, in this process (median)."""
    from sparkdist.elastic import TorchState

    model, optimizer, x, y = build(hidden, batch)
    one_step(model, optimizer, x, y)  # Adam's state exists after a step
    state = TorchState(model=model, optimizer=optimizer, step=0)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        state.save()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def _spread(values: list[float]) -> tuple[float, str]:
    return statistics.median(values), f"{min(values):.2f}-{max(values):.2f}"


def print_results(results: dict[str, list[list[tuple]]], args, commit_ms: float) -> None:
    """Per way: the slowest rank's wall ms a step and rank 0's CPU ms a step (medians over
    the rounds, min-max), each against plain's."""
    floors = {}
    rows = []
    for way in WAYS:
        wall, wall_range = _spread([max(r[0] for r in job) * 1e3 for job in results[way]])
        cpu, cpu_range = _spread([job[0][1] * 1e3 for job in results[way]])
        floors.setdefault("wall", wall)
        floors.setdefault("cpu", cpu)
        rows.append(
            [
                way,
                f"{wall:.2f}",
                wall_range,
                f"{(wall / floors['wall'] - 1) * 100:+.1f} %",
                f"{cpu:.2f}",
                cpu_range,
                f"{(cpu / floors['cpu'] - 1) * 100:+.1f} %",
            ]
        )
    title = (
        f"The elastic machinery, fault-free: 2 ranks, MLP 64-{args.hidden}-{args.hidden}-10, "
        f"Adam, batch {args.batch}, {args.steps - args.warmup} timed steps a job, "
        f"{args.rounds} rounds (medians, min-max); one commit's copy of this model and its "
        f"Adam state: {commit_ms:.2f} ms"
    )
    columns = [
        "way",
        "slowest rank wall ms/step",
        "min-max",
        "vs plain",
        "rank 0 CPU ms/step",
        "min-max",
        "vs plain",
    ]
    bench_table.print_table("elastic_overhead", title, columns, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument(
        "--no-warmup-jobs", action="store_true", help="no warm-up job per way (the test's)"
    )
    args = parser.parse_args()

    from sparkdist.spark.session import embedded_spark

    embedded_spark(executors=2, app_name="elastic-overhead", master="local-cluster[2,1,1024]")
    shape = (args.warmup + 10, args.warmup, args.hidden, args.batch)
    for way in () if args.no_warmup_jobs else WAYS:
        run_way(way, *shape)  # warm-up: imports, the executors' Python workers
    results: dict[str, list[list[tuple]]] = {way: [] for way in WAYS}
    for round_ in range(args.rounds):
        order = WAYS[round_ % len(WAYS) :] + WAYS[: round_ % len(WAYS)]
        for way in order:
            results[way].append(run_way(way, args.steps, args.warmup, args.hidden, args.batch))
        last = ", ".join(
            f"{way}: {max(r[0] for r in results[way][-1]) * 1e3:.2f}"
            f" ({results[way][-1][0][1] * 1e3:.2f} CPU)"
            for way in WAYS
        )
        print(f"  round {round_ + 1}/{args.rounds} (wall ms/step): {last}", flush=True)
    print_results(results, args, commit_cost_ms(args.hidden, args.batch))


if __name__ == "__main__":
    main()
