"""Parameter-server throughput: ParameterServerStrategy vs MultiWorkerMirroredStrategy.

On an embedded local-cluster[2,1,1024] Spark, trains the same model (tf_keras MLP on
scikit-learn's digits, Adam 0.01) on the same number of examples through HorovodRunner:

* ParameterServerStrategy, roles chief=1, worker=2, ps=1 (np=4, ranks_per_task=2): the
  chief's ClusterCoordinator schedules STEPS steps of BATCH examples on the 2 workers;
* the same with 2 ps and every variable sharded over both (FixedShardsPartitioner(2);
  np=5 does not split over 2 tasks, so the 5 ranks run in one task: ranks_per_task=5);
* MultiWorkerMirroredStrategy on 2 worker ranks (np=2): each rank takes BATCH examples per
  synchronous step (global batch 2 * BATCH) for STEPS / 2 steps.

The training code is tests/scripts/tf_parameter_server.py (`custom_loop` and
`mirrored_baseline`). Examples/s counts the training loop only (from the first step to
the last, first step's tracing included); "steady" leaves the first step out. Accuracy is
on the 20 % held out. One run of each; every rank is a process on this host.

    .venv/bin/python benchmarks/parameter_server_throughput.py [--steps 300] [--batch 64]
"""

from __future__ import annotations

import argparse
import logging
import os
import time

import bench_table  # a sibling script, not a package

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "scripts")
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2"}


def ps_chief(scripts: str, steps: int, batch: int, shards: int) -> dict:
    """The chief of a parameter-server job: the custom ClusterCoordinator loop."""
    import sys

    sys.path.insert(0, scripts)
    from tf_parameter_server import custom_loop

    return custom_loop(steps=steps, batch_size=batch, shards=shards)


def mirrored_rank(scripts: str, steps: int, batch: int) -> dict:
    """Every rank of a MultiWorkerMirroredStrategy job."""
    import sys

    sys.path.insert(0, scripts)
    from tf_parameter_server import mirrored_baseline

    return mirrored_baseline(steps=steps, batch_size=batch)


def run_parameter_server(ps: int, steps: int, batch: int) -> tuple[dict, float]:
    from sparkdist import HorovodRunner

    np = 1 + 2 + ps
    runner = HorovodRunner(
        np=np,
        roles={"chief": 1, "worker": 2, "ps": ps},
        ranks_per_task=2 if np % 2 == 0 else np,
        env=ENV,
    )
    started = time.perf_counter()
    result = runner.run(ps_chief, scripts=SCRIPTS, steps=steps, batch=batch, shards=ps)
    return result, time.perf_counter() - started


def run_mirrored(steps: int, batch: int) -> tuple[dict, float]:
    from sparkdist import HorovodRunner

    runner = HorovodRunner(np=2, env=ENV)
    started = time.perf_counter()
    results = runner.run_all(mirrored_rank, scripts=SCRIPTS, steps=steps, batch=batch)
    return results[0], time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="steps of --batch examples")
    parser.add_argument("--batch", type=int, default=64, help="examples per worker step")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)

    from sparkdist.spark.session import embedded_spark

    spark = embedded_spark(executors=2, app_name="sparkdist-bench")
    load_before = os.getloadavg()[0]
    jobs = [
        ("PSS: chief + 2 workers + 1 ps", lambda: run_parameter_server(1, args.steps, args.batch)),
        (
            "PSS: chief + 2 workers + 2 ps (sharded)",
            lambda: run_parameter_server(2, args.steps, args.batch),
        ),
        ("MWMS: 2 workers", lambda: run_mirrored(args.steps, args.batch)),
    ]
    rows = []
    for name, job in jobs:
        result, wall = job()
        examples = result.get("examples", result["steps"] * result["batch_size"])
        rows.append((name, result, examples, wall))
        print(f"  measured {name}: {result['examples_per_second']:.0f} examples/s", flush=True)
    spark.stop()
    load_after = os.getloadavg()[0]

    print()
    title = (
        f"{args.steps} steps of {args.batch} examples per worker step, 2 workers, "
        f"local-cluster[2,1,1024], one run each, {os.cpu_count()} cores, "
        f"load average {load_before:.1f} before, {load_after:.1f} after"
    )
    header = (
        f"{'strategy':<42} {'examples':>8} {'train s':>8} {'examples/s':>11} "
        f"{'steady ex/s':>12} {'accuracy':>9} {'job wall s':>11}"
    )
    lines, cells = [title, header], []
    for name, result, examples, wall in rows:
        lines.append(
            f"{name:<42} {examples:>8} {result['train_seconds']:>8.2f} "
            f"{result['examples_per_second']:>11.0f} "
            f"{result['steady_examples_per_second']:>12.0f} {result['accuracy']:>9.4f} "
            f"{wall:>11.1f}"
        )
        measured = ("train_seconds", "examples_per_second", "steady_examples_per_second")
        cells.append([name, examples, *(result[k] for k in measured), result["accuracy"], wall])
    columns = [
        "strategy",
        "examples",
        "train s",
        "examples/s",
        "steady ex/s",
        "accuracy",
        "job wall s",
    ]
    bench_table.print_table("strategies", title, columns, cells, text="\n".join(lines))


if __name__ == "__main__":
    main()
