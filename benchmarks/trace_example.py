"""A real job's trace and picture (issue 63): an in-process elastic torch job of 4 ranks on
a local-cluster, one rank three times slower, the task holding two ranks lost partway
through and seated back by Spark's retry, so the world goes 4 -> 2 -> 4.

    .venv/bin/python benchmarks/trace_example.py [--rounds 50] [--kill-at 16]
        [--out-trace PATH] [--figures DIR]

The job (`HorovodRunner(np=4, min_np=2, max_np=4, ranks_per_task=2)`, two tasks of two
ranks on `local-cluster[2,1,1024]`) runs `sparkdist.elastic.run` on gloo. Each rank reads
numpy batches of a small table (a converter in row groups of about 100 rows, read through
a transform as slow as a slow store, STORAGE_S_PER_ROW) and takes local SGD steps on a
fixed-seed MLP for ROUND_S seconds, a sleep of STEP_S per step (launch rank 1: three times
as long), each step `sparkdist.report({"loss": ...})`; then the ranks average their models
(an all_reduce) and `state.commit()`. The ranks average by time, not by step count, so
the slow rank takes fewer steps and its steps are longer in the trace: ranks that
all_reduce every step wait for each other and all show the slow rank's pace
(docs/monitoring.md, Stragglers).

After `--kill-at` rounds the driver side SIGKILLs the Spark task's Python worker that
holds launch ranks 2 and 3 (as tests/elastic/test_elastic_in_process.py does): ranks 0 and
1 go on in their processes, Spark runs the task again, and its ranks (launch ranks 4 and
5) join at a commit.

At the end it copies the job's trace to `--out-trace` (default
docs/figures/data/recovery-trace.json, which benchmarks/figures.py draws as recovery.svg),
writes the picture (`runner.last_job.timeline()`) as timeline-example.svg and .png in
`--figures` (default docs/figures), and prints the world's sizes over time, the slowest
rank, each rank's steps and data-wait share, and the trace's size. With
SPARKDIST_BENCH_OUT set (`make bench`) both defaults go there instead (the trace beside the
benchmarks' JSON, the pictures in its figures/), so the committed ones stay as they are.
It writes nothing unless the world went 4 -> 2 -> 4. Takes about 2 minutes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import bench_table  # noqa: E402 - a sibling script, not a package

ROUND_S = 1.0
"""How long each rank steps before the models are averaged and committed."""
STEP_S = 0.1
SLOW_RANK, SLOW_FACTOR = 1, 3
TASK_LOST = 2
"""The launch rank whose task's Python worker is killed (it holds ranks 2 and 3)."""
ROWS, FEATURES, BATCH = 4096, 8, 32
ROW_GROUP_BYTES = 4096
"""The converter's Parquet row groups: about 100 rows each, so a rank reads in small
chunks (a loader reopened after a world change waits for one chunk, not a file)."""
STORAGE_S_PER_ROW = 0.004
"""A slow store: reading a row costs this (250 rows/s a rank, one decode thread; a batch
of 32 in 0.13 s), so the fast ranks wait for data now and then and the slow one never
does."""


def rows_frame(spark):
    """A fixed regression table: y = sum(x * w) + noise, fixed seeds."""
    import numpy as np
    import pandas as pd

    generator = np.random.default_rng(0)
    x = generator.normal(size=(ROWS, FEATURES)).astype("float32")
    weights = np.linspace(-1.0, 1.0, FEATURES, dtype="float32")
    y = x @ weights + 0.1 * generator.normal(size=ROWS).astype("float32")
    frame = pd.DataFrame({f"x{i}": x[:, i] for i in range(FEATURES)})
    frame["y"] = y
    return spark.createDataFrame(frame).repartition(4)


def converter_of(spark):
    """The table written once as Parquet in small row groups (deleted at the end)."""
    from sparkdist.data import make_spark_converter

    return make_spark_converter(rows_frame(spark), parquet_row_group_size_bytes=ROW_GROUP_BYTES)


def slow_storage(frame):
    """The loader's transform (in its decode thread): as if the rows came from a slow
    store."""
    time.sleep(STORAGE_S_PER_ROW * len(frame))
    return frame


def train_main(rows, rounds: int, marks: str, round_s: float, step_s: float) -> dict:
    """A rank: local SGD steps for `round_s`, then the world averages its models and
    commits; `rounds` commits in all. Writes its task's pid to `marks` (so the driver side
    can kill it) and, on world rank 0, each round committed."""
    import numpy as np
    import psutil
    import torch
    import torch.distributed as dist

    import sparkdist
    from sparkdist import elastic
    from sparkdist.data import TransformSpec

    torch.set_num_threads(1)
    launch_rank = int(os.environ["RANK"])
    # The Spark task's Python worker: the parent of this rank's supervisor.
    task_pid = psutil.Process(os.getppid()).ppid()
    write_whole(Path(marks, f"task-pid-{launch_rank}"), str(task_pid))
    pace = step_s * (SLOW_FACTOR if launch_rank == SLOW_RANK else 1)

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
    state = elastic.TorchState(model=model, optimizer=optimizer, step=0, round=0)
    taken = {"steps": 0, "loss": None}

    @elastic.run
    def train(state):
        columns = [f"x{i}" for i in range(FEATURES)]
        # Opened on each (re)entry: RANK and WORLD_SIZE are this world's, so is its shard.
        spec = TransformSpec(slow_storage)
        with rows.make_numpy_batches(
            batch_size=BATCH, num_epochs=None, transform_spec=spec, workers_count=1
        ) as batches:
            batches = iter(batches)
            while state.round < rounds:
                deadline = time.monotonic() + round_s
                while True:
                    batch = next(batches)
                    x = torch.from_numpy(np.stack([batch[c] for c in columns], axis=1))
                    y = torch.from_numpy(batch["y"]).unsqueeze(1)
                    loss = torch.nn.functional.mse_loss(state.model(x), y)
                    state.optimizer.zero_grad()
                    loss.backward()
                    state.optimizer.step()
                    time.sleep(pace)  # the rest of the step's work
                    state.step += 1
                    taken["steps"] += 1
                    taken["loss"] = loss.item()
                    sparkdist.report({"loss": taken["loss"]}, step=state.step)
                    if time.monotonic() >= deadline:
                        break
                with torch.no_grad():  # the world's model: the mean of the ranks'
                    for parameter in state.model.parameters():
                        dist.all_reduce(parameter)
                        parameter /= state.world_size
                state.round += 1
                state.commit()  # a change of the world takes effect here
                if state.rank == 0:
                    write_whole(Path(marks, "round"), str(state.round))
        return {"rounds": state.round, "world": state.world_size, "loss": taken["loss"]}

    result = train(state)
    return {**(result or {}), "launch rank": launch_rank, "steps": taken["steps"]}


def write_whole(path: Path, text: str) -> None:
    """Write `text` at `path` so that a reader never sees it half written."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def read_int(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def lose_task_at(marks: Path, kill_at: int, done: threading.Event, said: dict) -> None:
    """Once world rank 0 committed round `kill_at`, SIGKILL the Python worker of the task
    that holds launch rank TASK_LOST (a lost executor, in miniature)."""
    while not done.wait(0.1):
        pid = read_int(marks / f"task-pid-{TASK_LOST}")
        if pid is not None and (read_int(marks / "round") or 0) >= kill_at:
            os.kill(pid, signal.SIGKILL)
            said["killed_at"] = time.time()
            print(f"round {kill_at}: killed the task of ranks 2 and 3 (pid {pid})", flush=True)
            return


def world_line(timeline) -> str:
    sizes = " -> ".join(f"{size} at {t:.1f} s" for t, size in timeline.world_sizes)
    return f"world size: {sizes}"


def summary(timeline, trace_path: Path) -> list[str]:
    """What the job did, from its trace."""
    lines = [world_line(timeline)]
    for change in timeline.world_changes:
        lines.append(f"  world change at {change.t_s:.1f} s to {change.size}: {change.why}")
    lines.append(f"slowest rank: {timeline.slowest_rank}")
    for rank in timeline.ranks:
        share = "-" if rank.data_wait_share is None else f"{rank.data_wait_share:.1%}"
        mean = "-" if rank.mean_step_s is None else f"{rank.mean_step_s:.3f} s"
        failed = f", failed: {rank.failures[0][:60]}" if rank.failures else ""
        lines.append(
            f"  rank {rank.rank}: {rank.steps} steps, mean step {mean}, "
            f"busy {rank.busy_s:.1f} s, data wait {rank.data_wait_s:.2f} s ({share}){failed}"
        )
    events = len(timeline.trace["traceEvents"])
    size = trace_path.stat().st_size
    lines.append(f"trace: {size:,} bytes, {events:,} events, {timeline.end_s:.1f} s")
    return lines


def defaults() -> tuple[Path, Path]:
    """Where the trace and the pictures go: build/bench under `make bench`, else docs/."""
    if os.environ.get(bench_table.OUT_ENV):
        out = bench_table.out_dir()
        return out / "recovery-trace.json", out / "figures"
    return ROOT / "docs" / "figures" / "data" / "recovery-trace.json", ROOT / "docs" / "figures"


def parse_args() -> argparse.Namespace:
    trace, figures = defaults()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50, help="commits in all (default 50)")
    parser.add_argument("--kill-at", type=int, default=16, help="lose the task at this round")
    parser.add_argument("--round-s", type=float, default=ROUND_S)
    parser.add_argument("--step-s", type=float, default=STEP_S)
    parser.add_argument("--out-trace", type=Path, default=trace)
    parser.add_argument("--figures", type=Path, default=figures)
    parser.add_argument("--master", default="local-cluster[2,1,1024]")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    from sparkdist import HorovodRunner
    from sparkdist.spark.session import embedded_spark

    conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"}
    spark = embedded_spark(master=args.master, app_name="sparkdist-trace-example", conf=conf)
    rows = converter_of(spark)
    marks = Path(tempfile.mkdtemp(prefix="sparkdist-trace-example-"))
    done, said = threading.Event(), {}
    killer = threading.Thread(target=lose_task_at, args=(marks, args.kill_at, done, said))
    killer.start()
    runner = HorovodRunner(np=4, min_np=2, max_np=4, ranks_per_task=2)
    started = time.time()
    try:
        result = runner.run(
            train_main,
            rows=rows,
            rounds=args.rounds,
            marks=str(marks),
            round_s=args.round_s,
            step_s=args.step_s,
        )
    finally:
        done.set()
        killer.join()
        shutil.rmtree(marks, ignore_errors=True)
        rows.delete()
    job = runner.last_job
    print(f"job {job.job_id}: {time.time() - started:.1f} s, rank 0's result {result}")
    print(f"re-formed: {job.reformed}")
    timeline = job.timeline()
    sizes = [size for _, size in timeline.world_sizes]
    for line in summary(timeline, Path(job.trace)):
        print(line)
    if sizes != [4, 2, 4]:
        raise SystemExit(f"the world went {sizes}, not 4 -> 2 -> 4: nothing written")
    args.out_trace.parent.mkdir(parents=True, exist_ok=True)
    args.figures.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(job.trace, args.out_trace)
    (args.figures / "timeline-example.svg").write_text(timeline.svg())
    timeline.to_png(args.figures / "timeline-example.png")
    for path in (args.out_trace, args.figures / "timeline-example.svg"):
        print(f"wrote {path}")
    print(f"wrote {args.figures / 'timeline-example.png'}")


if __name__ == "__main__":
    main()
