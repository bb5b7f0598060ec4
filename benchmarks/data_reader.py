"""Spark DataFrames to ranks at scale: conversion cost and per-rank read speed, beside peers.

    .venv/bin/python benchmarks/data_reader.py [--rows 8400000] [--features 64] [--baseline DIR]
    .venv/bin/python benchmarks/data_reader.py --codecs [--codec-rows 1000000]

Spark (local[2]) generates a DataFrame (a label and an array of float32 features) and
writes it with its own Parquet writer (snappy): the source, over 2 GB on disk at the
default size. Then, in one table:

* conversion: `make_spark_converter` of the source scan (read in place: no byte written),
  and of the generated DataFrame itself (a copy, in the default codec), against Spark's own
  write of the same rows; Mosaic Streaming's MDS copy of the same rows (`MDSWriter` fed
  from the source's Parquet, one writer process per rank, each over its share of the files,
  then the partitions' indexes merged, as `dataframe_to_mds` does with Spark tasks: that
  converter imports `streaming` in Spark's Python workers, whose package `__init__` needs
  torchvision, which does not import beside this CPU torch).
* reading: 2 ranks at once (2 processes started together), each reading its half for one
  epoch in batches of `--batch-size` as numpy/tensors; rows/s and MB/s (bytes of the
  arrays delivered) per rank. The reference is a plain pyarrow loop (`iter_batches` over
  the rank's half of the files, columns to numpy); then sparkdist's torch loader on the
  source in place and on its copy, and in place with the global shuffle; petastorm 0.13.1
  (`make_batch_reader` + `BatchedDataLoader`, in the side environment .venv-petastorm from
  `make petastorm-side`);
  Mosaic Streaming (`StreamingDataset` on the local MDS copy, torch `DataLoader`).
  The loop and sparkdist's three readers run `--rounds` rounds (default 3), each starting
  with another reader; each rank's best round is shown (a shared machine's load swings
  the loop alone between 1.0 and 2.3M rows/s). The slow peers run once. "+RSS" is how much
  the reader's peak resident memory grew while it read (beyond its imports and setup).
  "CPU s" is the reader process's CPU time (all its threads) in that round, and "cpu vs
  loop" the rows per CPU second against the loop's: steadier than wall time on a machine
  that others load.
  `--baseline DIR` adds sparkdist's in-place readers (in order and shuffled) from another
  checkout (e.g. `git worktree add DIR main`) to the interleaved rounds: before and after
  a change, side by side on the same files and the same load (with `--wide`: the other
  checkout's numpy readers of the wide shape, in order, shuffled and each
  ``workers_count``, as ``baseline: ...`` rows). With `--wide`, "+RSS" adds the peak
  private memory of the reader's decode processes (``reader_pool_type="process"``, sampled
  every 20 ms), and "CPU s" their CPU time.
* randomness of the shuffled order (epoch 0): the Spearman correlation between a row's
  place in the files and in the epoch, and the share of rows whose next row in the files
  is in the same batch (`sparkdist.data.rank.order.randomness`), beside a true permutation's
  and the files' order.

`--codecs` instead measures the codecs a copy can use (what chose the default): for each,
Spark's write time and bytes, and the rows/s of one sparkdist reader over the copy, on
random floats (incompressible) and on 17-level "pixels" (as in scikit-learn's digits).

Nothing is installed at run time: Mosaic Streaming comes from `make bench-deps`
(requirements/bench-streaming.txt, installed --no-deps into .bench-streaming). Everything
written goes under one temporary directory, removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_table  # a sibling script, not a package

ROOT = Path(__file__).resolve().parents[1]
STREAMING_DIR = ROOT / ".bench-streaming"

# Loads Mosaic Streaming's reader and writer without its package __init__, which imports
# its vision datasets and so torchvision (not importable beside this CPU torch).
STREAMING_IMPORT = """
import importlib.util, sys, types
_spec = importlib.util.find_spec("streaming")
_pkg = types.ModuleType("streaming")
_pkg.__path__ = list(_spec.submodule_search_locations)
sys.modules["streaming"] = _pkg
import streaming.base as _base
from streaming._version import __version__ as STREAMING_VERSION
MDSWriter, StreamingDataset = _base.MDSWriter, _base.StreamingDataset
"""

# The end of every reader process: says "ready", waits for the go file, runs its read(),
# prints [rows, bytes delivered, seconds, +RSS MiB, CPU s] as JSON.
MEASURED = """
def status_mib(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field)) / 1024

def children_private_mib():
    # The private memory of this process's children (decode processes): what they add,
    # not the pages they share with this one since the fork.
    total = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as listed:
                pids = listed.read().split()
        except OSError:
            continue
        for pid in pids:
            try:
                with open(f"/proc/{pid}/smaps_rollup") as rollup:
                    total += sum(int(line.split()[1]) for line in rollup
                                 if line.startswith(("Private_Clean", "Private_Dirty")))
            except OSError:
                pass
    return total / 1024

import resource, threading
def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime

print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.01)
# The peak from here on: VmHWM, reset (ru_maxrss would keep the peak of the process this
# one was forked from, the benchmark's own, across exec), plus the peak of the decode
# processes' private memory, sampled every 20 ms.
with open("/proc/self/clear_refs", "w") as clear:
    clear.write("5")
before = status_mib("VmRSS")
peak_children, stop = [0.0], threading.Event()
def sample():
    while not stop.wait(0.02):
        peak_children[0] = max(peak_children[0], children_private_mib())
threading.Thread(target=sample, daemon=True).start()
start, cpu = time.perf_counter(), time.process_time() + children_cpu()
rows, size = read()
seconds = time.perf_counter() - start
cpu = time.process_time() + children_cpu() - cpu  # the decode processes' too
stop.set()
grown = max(status_mib("VmHWM") - before, 0) + peak_children[0]
print(json.dumps([rows, size, seconds, grown, cpu]), flush=True)
"""

# A reader process: imports and opens its reader, says "ready", waits for the go file,
# reads its half for one epoch, prints (rows, bytes delivered, seconds) as JSON.
WORKER = (
    """
import json, os, sys, time
kind, rank, world, batch_size, spec, go = sys.argv[1:7]
rank, world, batch_size = int(rank), int(world), int(batch_size)
spec = json.loads(spec)

def arrays_bytes(*arrays):
    return sum(a.nbytes for a in arrays)

if kind == "pyarrow":
    import pyarrow.parquet as pq
    def read():
        rows = size = 0
        for path in spec["files"][rank::world]:
            for batch in pq.ParquetFile(path).iter_batches(batch_size):
                features = batch.column("features")
                x = features.flatten().to_numpy().reshape(len(features), -1)
                y = batch.column("label").to_numpy()
                rows, size = rows + len(y), size + arrays_bytes(x, y)
        return rows, size
elif kind == "sparkdist":
    import pickle
    import torch  # imported before the clock starts, as by the other loaders
    with open(spec["handle"], "rb") as f:
        converter = pickle.load(f)
    def read():
        rows = size = 0
        with converter.make_torch_dataloader(
            batch_size=batch_size, num_epochs=1, cur_shard=rank, shard_count=world,
            shuffle=spec["shuffle"]
        ) as loader:
            for batch in loader:
                x, y = batch["features"], batch["label"]
                rows += len(y)
                size += x.element_size() * x.nelement() + y.element_size() * y.nelement()
        return rows, size
elif kind == "petastorm":
    import warnings
    warnings.simplefilter("ignore")
    from petastorm import make_batch_reader
    from petastorm.pytorch import BatchedDataLoader
    def read():
        rows = size = 0
        urls = ["file://" + path for path in spec["files"]]
        # workers_count=4: petastorm's make_torch_dataloader default.
        with make_batch_reader(urls, num_epochs=1, workers_count=4, cur_shard=rank,
                               shard_count=world, shuffle_row_groups=False) as reader:
            for batch in BatchedDataLoader(reader, batch_size=batch_size):
                x, y = batch["features"], batch["label"]
                rows += len(y)
                size += x.element_size() * x.nelement() + y.element_size() * y.nelement()
        return rows, size
elif kind == "streaming":
    # Streaming's own view of the world; it also joins torch.distributed when it can.
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=spec["port"])
    exec(spec["import"])
    from torch.utils.data import DataLoader
    dataset = StreamingDataset(local=spec["mds"], batch_size=batch_size, shuffle=False)
    def read():
        rows = size = 0
        for batch in DataLoader(dataset, batch_size=batch_size, num_workers=0):
            x, y = batch["features"], batch["label"]
            rows += len(y)
            size += x.element_size() * x.nelement() + y.element_size() * y.nelement()
            if rows >= spec["max_rows"]:  # its rate is steady; a full epoch takes minutes
                break
        return rows, size
"""
    + MEASURED
)


def run_ranks(python: str, kind: str, spec: dict, world: int, batch: int, work: Path, env=None):
    """Start `world` reader processes, release them together; [(rows, bytes, seconds)]."""
    go = work / f"go-{kind}-{time.monotonic_ns()}"
    procs = [
        subprocess.Popen(
            [python, "-c", WORKER, kind, str(r), str(world), str(batch), json.dumps(spec), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            cwd=work,  # not a checkout: `-c` puts the working directory before PYTHONPATH
        )
        for r in range(world)
    ]
    try:
        for proc in procs:
            line = proc.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"{kind} reader did not start: {proc.stderr.read()[-2000:]}")
        go.touch()
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=3600)
            if proc.returncode != 0:
                raise RuntimeError(f"{kind} reader failed: {err[-2000:]}")
            results.append(tuple(json.loads(out.strip().splitlines()[-1])))
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def start_spark(cores: int = 2):
    from sparkdist.spark.session import embedded_spark

    return embedded_spark(
        app_name="sparkdist-bench-data-reader",
        master=f"local[{cores}]",
        conf={"spark.driver.memory": "3g", "spark.sql.shuffle.partitions": "16"},
    )


def generate(spark, rows: int, features: int, partitions: int, pixels: bool = False):
    """A label and `features` float32 values per row: uniform, or 17 levels (k/16)."""
    from pyspark.sql import functions as F

    def value(i):
        v = F.rand(seed=i)
        return (F.floor(v * 17) / 16).cast("float") if pixels else v.cast("float")

    return spark.range(rows, numPartitions=partitions).select(
        (F.col("id") % 10).alias("label"),
        F.array(*[value(i) for i in range(features)]).alias("features"),
    )


def timed(action):
    start = time.perf_counter()
    result = action()
    return result, time.perf_counter() - start


MDS_WRITER = """
import json, sys
import pyarrow.parquet as pq
files, out, features = json.loads(sys.argv[1])
exec(json.loads(sys.argv[2]))
columns = {"label": "int64", "features": f"ndarray:float32:{features}"}
with MDSWriter(out=out, columns=columns, compression=None) as writer:
    for path in files:
        for batch in pq.ParquetFile(path).iter_batches(8192):
            labels = batch.column("label").to_numpy()
            matrix = batch.column("features").flatten().to_numpy().reshape(len(labels), -1)
            for label, row in zip(labels, matrix):
                writer.write({"label": int(label), "features": row})
"""


def write_mds(source_files: list[str], out: Path, features: int, writers: int) -> float:
    """Mosaic Streaming's MDS copy of the source rows: `writers` processes, each writing
    its share of the files sample by sample (MDSWriter) into a partition, then the
    partitions' indexes merged (what dataframe_to_mds does with Spark tasks)."""
    env = {**os.environ, "PYTHONPATH": f"{STREAMING_DIR}:{os.environ.get('PYTHONPATH', '')}"}
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                MDS_WRITER,
                json.dumps([source_files[i::writers], str(out / str(i)), features]),
                json.dumps(STREAMING_IMPORT),
            ],
            env=env,
        )
        for i in range(writers)
    ]
    if any(proc.wait() != 0 for proc in procs):
        raise RuntimeError("an MDS writer failed")
    namespace: dict = {}
    exec(STREAMING_IMPORT + "from streaming.base.util import merge_index", namespace)
    namespace["merge_index"](str(out), keep_local=True)
    return time.perf_counter() - start


def streaming_status() -> str | None:
    """None when Mosaic Streaming imports from .bench-streaming, else why not."""
    if not STREAMING_DIR.is_dir():
        return "not installed (make bench-deps)"
    code = STREAMING_IMPORT + "print(STREAMING_VERSION)"
    env = {**os.environ, "PYTHONPATH": f"{STREAMING_DIR}:{os.environ.get('PYTHONPATH', '')}"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        return f"does not import: {(result.stderr.strip().splitlines() or ['?'])[-1][:80]}"
    return None


READING_COLUMNS = (
    "reader",
    "rank",
    "rows",
    "seconds",
    "rows/s",
    "MB/s",
    "written MiB",
    "vs loop",
    "+RSS MiB",
    "CPU s",
    "cpu vs loop",
)


def print_table(rows: list[tuple], title: str) -> None:
    header = (
        f"{'':44} {'rank':>4} {'rows':>9} {'seconds':>8} {'rows/s':>10} {'MB/s':>7} "
        f"{'written':>10} {'vs loop':>7} {'+RSS MiB':>8} {'CPU s':>6} {'cpu vs loop':>11}"
    )
    lines = [title, header, "-" * len(header)]
    for label, rank, count, seconds, size, written, ratio, *grown in rows:
        if count is None:
            lines.append(f"{label:44} {rank:>4} {seconds}")
            continue
        rate = f"{count / seconds:>10,.0f}" if count else f"{'':>10}"
        mbs = f"{size / seconds / 1e6:>7.0f}" if size else f"{'':>7}"
        wrote = f"{written / 2**20:>6.0f} MiB" if written is not None else f"{'':>10}"
        vs = f"{ratio:>7.2f}" if ratio is not None else f"{'':>7}"
        rss = f"{grown[0]:>8.0f}" if grown else ""
        cpu = f"{grown[1]:>6.1f} {grown[2]:>11.2f}" if len(grown) > 1 else ""
        line = (
            f"{label:44} {rank:>4} {count or '':>9} {seconds:>8.1f} {rate} {mbs} {wrote} {vs} "
            f"{rss} {cpu}"
        )
        lines.append(line.rstrip())
    cells = [reading_cells(row) for row in rows]
    about = "conversion against the peers, then each rank's read"
    bench_table.print_table("reading", about, READING_COLUMNS, cells, text="\n".join(lines))


def reading_cells(row: tuple) -> list:
    """One row of `print_table` as the JSON's numbers (None where the table is blank)."""
    label, rank, count, seconds, size, written, ratio, *grown = row
    if count is None:
        return [label, rank, None, seconds, *[None] * 7]
    rate = count / seconds if count else None
    mbs = size / seconds / 1e6 if size else None
    wrote = written / 2**20 if written is not None else None
    grown = [*grown, None, None, None][:3]
    return [label, rank, count or None, seconds, rate, mbs, wrote, ratio, *grown]


def check_disk(work: Path, needed: int) -> None:
    free = shutil.disk_usage(work).free
    if free < needed * 1.3:
        raise SystemExit(
            f"not enough disk under {work}: {free / 2**30:.1f} GiB free, the benchmark writes "
            f"about {needed / 2**30:.1f} GiB; use --workdir or fewer --rows"
        )


def main_benchmark(args, work: Path) -> None:
    from sparkdist.data import make_spark_converter
    from sparkdist.data.driver.convert import DEFAULT_COMPRESSION_CODEC

    row_bytes = args.features * 4 + 8
    check_disk(work, 4 * args.rows * row_bytes)  # source, copy, MDS copy, slack
    spark = start_spark()
    table: list[tuple] = []
    try:
        generated = generate(spark, args.rows, args.features, args.partitions)
        source = work / "source"
        _, seconds = timed(lambda: generated.write.parquet(str(source)))
        spark_bytes = dir_bytes(source)
        table.append(
            ("Spark's own Parquet write (snappy)", "-", args.rows, seconds, 0, spark_bytes, None)
        )

        cache_dir = (work / "cache").as_uri()
        in_place, seconds = timed(
            lambda: make_spark_converter(spark.read.parquet(str(source)), cache_dir_url=cache_dir)
        )
        assert in_place.cache_dir_url is None, "the Parquet source was copied"
        table.append(
            (
                "sparkdist convert: Parquet scan, in place",
                "-",
                args.rows,
                seconds,
                0,
                dir_bytes(work / "cache"),
                None,
            )
        )
        copy, seconds = timed(lambda: make_spark_converter(generated, cache_dir_url=cache_dir))
        table.append(
            (
                f"sparkdist convert: copy ({DEFAULT_COMPRESSION_CODEC})",
                "-",
                args.rows,
                seconds,
                0,
                dir_bytes(work / "cache"),
                None,
            )
        )
    finally:
        spark.stop()
    files = sorted(str(p) for p in source.glob("*.parquet"))
    print(
        f"{args.rows} rows x ({args.features} float32 + int64 label), source {len(files)} files, "
        f"{spark_bytes / 2**30:.2f} GiB on disk; batch {args.batch_size}; {args.ranks} ranks "
        f"reading at once (one process each); 2 cores",
        flush=True,
    )
    mds = work / "mds"
    streaming_why = streaming_status()
    if streaming_why is None:
        sys.path.insert(0, str(STREAMING_DIR))
        seconds = write_mds(files, mds, args.features, args.ranks)
        table.append(
            (
                f"Mosaic Streaming MDS copy ({args.ranks} MDSWriters)",
                "-",
                args.rows,
                seconds,
                0,
                dir_bytes(mds),
                None,
            )
        )
    else:
        table.append(
            ("Mosaic Streaming MDS copy", "-", None, f"n/a: {streaming_why}", 0, None, None)
        )

    handles = {}
    for name, converter in (("in place", in_place), ("copy", copy)):
        handles[name] = work / f"{name.replace(' ', '-')}.pkl"
        handles[name].write_bytes(pickle.dumps(converter))
    python = sys.executable
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    runs = [
        ("plain pyarrow loop (its half of the files)", python, "pyarrow", {"files": files}, env)
    ]
    runs += [
        (
            f"sparkdist torch loader, {name}",
            python,
            "sparkdist",
            {"handle": str(path), "shuffle": False},
            env,
        )
        for name, path in handles.items()
    ]
    runs.append(
        (
            "sparkdist torch loader, in place, shuffle",
            python,
            "sparkdist",
            {"handle": str(handles["in place"]), "shuffle": True},
            env,
        )
    )
    if Path(args.petastorm_python).exists():
        label = "petastorm 0.13.1 BatchedDataLoader"
        runs.append((label, args.petastorm_python, "petastorm", {"files": files}, env))
    else:
        why = "n/a: no .venv-petastorm (make petastorm-side)"
        table.append(("petastorm", "-", None, why, 0, None, None))
    if streaming_why is None:
        streaming_env = {**env, "PYTHONPATH": f"{STREAMING_DIR}:{env['PYTHONPATH']}"}
        spec = {
            "mds": str(mds),
            "import": STREAMING_IMPORT,
            "port": str(free_port()),
            "max_rows": args.streaming_rows,
        }
        label = f"Mosaic Streaming 0.14.2 (first {args.streaming_rows // 1000}k rows)"
        runs.append((label, python, "streaming", spec, streaming_env))
    ours = 4 + len(baseline_runs(args, handles["in place"], env, runs))
    best = best_of_rounds(runs[:ours], args, work)  # the loop and sparkdist's readers
    for run in runs[ours:]:  # the peers, far slower: one round
        best.update(best_of_rounds([run], argparse.Namespace(**{**vars(args), "rounds": 1}), work))
    baseline = cpu_baseline = None
    for label, *_ in runs:
        results = best[label]
        if isinstance(results, str):
            table.append((label, "-", None, f"n/a: {results}", 0, None, None))
            continue
        if baseline is None:
            baseline = sum(rows / seconds for rows, _, seconds, *_ in results) / len(results)
            cpu_baseline = sum(rows / cpu for rows, *_, cpu in results) / len(results)
        for rank, (rows, size, seconds, grown, cpu) in enumerate(results):
            ratio, cpu_ratio = rows / seconds / baseline, rows / cpu / cpu_baseline
            table.append(
                (label, str(rank), rows, seconds, size, None, ratio, grown, cpu, cpu_ratio)
            )
    print(f"reading: each rank's best of {args.rounds} rounds (the peers: one round)")
    print_table(table, "")
    print_randomness(in_place.layout, args.batch_size)


def print_randomness(layout, batch_size: int) -> None:
    """How random the shuffled order is, beside a true permutation and the files' order."""
    import numpy as np

    from sparkdist.data.rank import order

    n = layout.num_rows
    shuffled = order.EpochOrder(layout.row_group_rows, 0, 0, True, order.DEFAULT_WINDOW_ROWS)
    inside = shuffled.windows[0]
    rows = [
        ("sparkdist shuffle=True, the epoch", shuffled.row_ids([(0, n)])),
        (f"sparkdist shuffle=True, one window ({inside.rows} rows)", shuffled.permutation(inside)),
        ("a true permutation", np.random.default_rng(0).permutation(n)),
        ("the files' order", np.arange(n)),
    ]
    title = f"randomness of epoch 0's order ({len(shuffled.windows)} windows, batch {batch_size})"
    lines = [f"\n{title}", f"{'':58} {'Spearman':>9} {'neighbours in a batch':>22}"]
    cells = []
    for label, row_ids in rows:
        measure = order.randomness(row_ids, batch_size)
        lines.append(f"{label:58} {measure['spearman']:>9.4f} {measure['neighbours']:>22.4%}")
        cells.append([label, measure["spearman"], measure["neighbours"]])
    columns = ["order", "Spearman", "neighbours in a batch (share)"]
    bench_table.print_table("randomness", title, columns, cells, text="\n".join(lines))


def baseline_runs(args, handle: Path, env: dict, runs: list) -> list[tuple]:
    """`--baseline`'s in-place readers, in order and shuffled, put after sparkdist's."""
    added = []
    if args.baseline:
        base_env = {**env, "PYTHONPATH": f"{Path(args.baseline).resolve()}"}
        for shuffle in (False, True):
            label = f"baseline checkout, in place{', shuffle' if shuffle else ''}"
            spec = {"handle": str(handle), "shuffle": shuffle}
            added.append((label, sys.executable, "sparkdist", spec, base_env))
    runs[4:4] = added
    return added


def best_of_rounds(runs: list[tuple], args, work: Path) -> dict:
    """{label: [(rows, bytes, seconds) per rank, the fastest of the rounds] or why not}.

    Each round runs every reader once, starting one reader later than the round before,
    so that none always runs first (or right after the same neighbour).
    """
    best: dict = {}
    for round_ in range(args.rounds):
        for i in range(len(runs)):
            label, interpreter, kind, spec, run_env = runs[(i + round_) % len(runs)]
            if isinstance(best.get(label), str):
                continue
            try:
                results = run_ranks(
                    interpreter, kind, spec, args.ranks, args.batch_size, work, run_env
                )
            except RuntimeError as error:
                best[label] = str(error).splitlines()[-1][:70]
                continue
            kept = best.setdefault(label, results)
            pairs = zip(kept, results, strict=True)
            best[label] = [min(a, b, key=lambda rank: rank[2]) for a, b in pairs]
    return best


def codec_benchmark(args, work: Path) -> None:
    from sparkdist.data import make_spark_converter
    from sparkdist.data.rank.reader import ShardReader

    check_disk(work, 2 * args.codec_rows * (args.features * 4 + 8))
    spark = start_spark()
    table = []
    try:
        for shape in ("random floats", "pixels (17 levels)"):
            df = generate(
                spark, args.codec_rows, args.features, args.partitions, shape != "random floats"
            )
            df = df.cache()
            df.count()
            for codec in ("uncompressed", "snappy", "lz4_raw", "zstd"):
                cache_dir = work / f"codec-{codec}"
                started = time.perf_counter()
                converter = make_spark_converter(
                    df, compression_codec=codec, cache_dir_url=cache_dir.as_uri()
                )
                write_s = time.perf_counter() - started
                size = dir_bytes(cache_dir)
                reads = []
                for _ in range(args.repeats):
                    reader = ShardReader(
                        converter.layout,
                        batch_size=args.batch_size,
                        num_epochs=1,
                        cur_shard=0,
                        shard_count=1,
                    )
                    rows, seconds = timed(lambda r=reader: sum(len(b["label"]) for b in r))
                    reads.append(seconds)
                table.append((f"{shape}: {codec}", rows, write_s, size, min(reads)))
                converter.delete()
            df.unpersist()
    finally:
        spark.stop()
    title = (
        f"{args.codec_rows} rows x ({args.features} float32 + int64 label); "
        f"one reader, best of {args.repeats}"
    )
    header = f"{'data: codec':34} {'write s':>8} {'MiB':>7} {'rows/s read':>12} {'MB/s read':>10}"
    lines = [title, header, "-" * len(header)]
    cells = []
    for label, rows, write_s, size, read_s in table:
        mbs = rows * (args.features * 4 + 8) / read_s / 1e6
        lines.append(
            f"{label:34} {write_s:>8.1f} {size / 2**20:>7.0f} {rows / read_s:>12,.0f} {mbs:>10.0f}"
        )
        cells.append([label, write_s, size / 2**20, rows / read_s, mbs])
    columns = ["data: codec", "write s", "MiB", "rows/s read", "MB/s read"]
    bench_table.print_table("codecs", title, columns, cells, text="\n".join(lines))


# A reader of the wide shape (one process, one rank): imports, then `MEASURED` reads one epoch.
WIDE_WORKER = (
    """
import json, os, sys, time
spec, go = json.loads(sys.argv[1]), sys.argv[2]
batch_size, kind = spec["batch"], spec["kind"]
import numpy as np
if kind in ("torch", "loop-stack", "numpy-torch"):
    import torch  # imported before the clock starts, as a training script does
    import torch.utils.data

def nbytes(batch):
    return sum(v.nbytes if hasattr(v, "nbytes") else v.element_size() * v.nelement()
               for v in batch.values())

if kind.startswith("loop"):
    import pyarrow.parquet as pq
    def read():
        rows = size = 0
        for path in spec["files"]:
            parquet = pq.ParquetFile(path)
            for group in range(parquet.num_row_groups):
                table = parquet.read_row_group(group)
                columns = {name: table.column(name).to_numpy() for name in table.column_names}
                if kind == "loop-stack":  # the model's feature tensor, stacked per row group
                    # (a transposed copy: np.stack, a column at a time, is 8x slower)
                    parts = np.array([columns.pop(name) for name in spec["features"]])
                    columns = {"x": np.ascontiguousarray(parts.T), **columns}
                for start in range(0, table.num_rows, batch_size):
                    batch = {name: v[start:start + batch_size] for name, v in columns.items()}
                    if kind == "loop-stack":
                        batch = {name: torch.from_numpy(v) for name, v in batch.items()}
                    rows, size = rows + len(batch["label"]), size + nbytes(batch)
        return rows, size
else:
    import pickle
    if kind == "torch":  # the loader's own imports (DataLoader), before the clock too
        from sparkdist.data.rank import torch_loader
    with open(spec["handle"], "rb") as f:
        converter = pickle.load(f)
    options = dict(batch_size=batch_size, num_epochs=1, cur_shard=0, shard_count=1,
                   **spec["options"])
    make = converter.make_torch_dataloader if kind == "torch" else converter.make_numpy_batches
    def read():
        rows = size = 0
        with make(**options) as loader:
            for batch in loader:
                if kind == "numpy-torch":  # the floor of a batch of 66 tensors
                    batch = {name: torch.from_numpy(v) for name, v in batch.items()}
                rows, size = rows + len(batch["label"]), size + nbytes(batch)
        return rows, size
"""
    + MEASURED
)


def run_wide_reader(spec: dict, work: Path, env: dict) -> tuple:
    """One wide-shape reader process, released once it is ready: (rows, bytes, s, +RSS, CPU s)."""
    go = work / f"go-wide-{time.monotonic_ns()}"
    proc = subprocess.Popen(
        [sys.executable, "-c", WIDE_WORKER, json.dumps(spec), str(go)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
        cwd=work,  # not a checkout: `-c` puts the working directory before PYTHONPATH
    )
    try:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{spec['kind']} reader did not start: {proc.stderr.read()[-2000:]}")
        go.touch()
        out, err = proc.communicate(timeout=3600)
        if proc.returncode != 0:
            raise RuntimeError(f"{spec['kind']} reader failed: {err[-2000:]}")
        return tuple(json.loads(out.strip().splitlines()[-1]))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def generate_wide(spark, rows: int, columns: int, partitions: int):
    """An id, a label and `columns` float32 scalar columns f0.. (a feature table's shape)."""
    from pyspark.sql import functions as F

    return spark.range(rows, numPartitions=partitions).select(
        F.col("id"),
        (F.col("id") % 10).cast("int").alias("label"),
        *[F.rand(seed=i).cast("float").alias(f"f{i}") for i in range(columns)],
    )


def generate_array(spark, rows: int, columns: int, partitions: int):
    """The same values as `generate_wide`, the features as one array column."""
    from pyspark.sql import functions as F

    wide = generate_wide(spark, rows, columns, partitions)
    features = F.array(*[F.col(f"f{i}") for i in range(columns)]).alias("features")
    return wide.select("id", "label", features)


PROCESSES = {"reader_pool_type": "process"}  # the rank's share of the cores, as threads
PROCESSES_SHUFFLED = {**PROCESSES, "shuffle": True}


def wide_readers(workers: list[int]) -> list[tuple[str, str, str, dict]]:
    """(label, shape, kind, loader options) of every reader in a round: the loops first.
    The loaders' default decode threads are the rank's share of the cores; ``workers``
    rows give them 1, 2, ... threads, to show how the rate scales on this machine."""
    stack = {"x": r"f\d+"}
    readers = [
        ("plain pyarrow loop: row group to numpy, slices", "wide", "loop", {}),
        ("sparkdist numpy batches, in order", "wide", "numpy", {}),
        ("sparkdist numpy batches, shuffle", "wide", "numpy", {"shuffle": True}),
    ]
    for pool in ("thread", "process"):
        for count in workers:
            for label, options in (("in order", {}), ("shuffle", {"shuffle": True})):
                options = {**options, "workers_count": count}
                name = f"  {label}, workers_count={count}"
                if pool == "process":
                    options["reader_pool_type"] = pool
                    name = f"  {label}, {count} decode process{'es' if count > 1 else ''}"
                readers.append((name, "wide", "numpy", options))
    readers += [
        (
            "sparkdist numpy, features= stack, shuffle",
            "wide",
            "numpy",
            {"shuffle": True, "features": stack},
        ),
        ("sparkdist numpy, shuffle, decode processes", "wide", "numpy", PROCESSES_SHUFFLED),
        ("sparkdist torch batches, in order", "wide", "torch", {}),
        ("sparkdist torch, in order, decode processes", "wide", "torch", PROCESSES),
        ("sparkdist torch, shuffle, decode processes", "wide", "torch", PROCESSES_SHUFFLED),
        ("numpy batches + torch.from_numpy a column", "wide", "numpy-torch", {}),
        ("sparkdist torch batches, shuffle", "wide", "torch", {"shuffle": True}),
        ("numpy batches + torch.from_numpy, shuffle", "wide", "numpy-torch", {"shuffle": True}),
        ("plain loop, torch, stacked per row group", "wide", "loop-stack", {}),
        ("sparkdist torch, features= stack, in order", "wide", "torch", {"features": stack}),
        (
            "sparkdist torch, features= stack, shuffle",
            "wide",
            "torch",
            {"shuffle": True, "features": stack},
        ),
        ("array column: sparkdist numpy, in order", "array", "numpy", {}),
        ("array column: sparkdist numpy, shuffle", "array", "numpy", {"shuffle": True}),
        ("array column: sparkdist torch, shuffle", "array", "torch", {"shuffle": True}),
    ]
    return readers


def baseline_wide_readers(readers: list[tuple]) -> list[tuple]:
    """`--baseline`'s numpy and torch readers of the wide shape (in order, shuffled, the
    scaling rows), labelled ``baseline: ...``, to run in the same rounds as this checkout's."""
    return [
        (f"baseline: {label.strip()}", shape, kind, options)
        for label, shape, kind, options in readers
        if shape == "wide"
        and kind in ("numpy", "torch")
        and "features" not in options
        and "reader_pool_type" not in options  # decode processes are new
    ]


def chosen_readers(readers: list[tuple], only: str | None) -> list[tuple]:
    """The readers whose label holds one of ``only``'s comma-separated words (None: all);
    the two plain loops, which the ratios are taken against, always."""
    if not only:
        return readers
    words = only.split(",")
    return [
        reader
        for index, reader in enumerate(readers)
        if index == 0 or reader[2] == "loop-stack" or any(word in reader[0] for word in words)
    ]


def tensor_views_floor(columns: int, batch: int) -> None:
    """What making a batch's tensors costs torch itself, against numpy's views: a chunk
    of 128 batches of ``columns`` float32 columns cut into one dict a batch, each made,
    read (``nbytes``) and freed, with Python's garbage collector on as in training."""
    import timeit

    import numpy as np
    import torch

    rows, names = 128 * batch, [f"f{i}" for i in range(columns)]
    arrays = [np.random.default_rng(i).random(rows, dtype=np.float32) for i in range(columns)]
    tensors = [torch.from_numpy(values) for values in arrays]

    def numpy_views() -> list[dict]:
        pieces = [list(values.reshape(128, batch)) for values in arrays]
        return [dict(zip(names, row, strict=True)) for row in zip(*pieces, strict=True)]

    def read_numpy() -> None:
        for made in numpy_views():
            sum(values.nbytes for values in made.values())

    def read_from_numpy() -> None:  # as the loader makes them: a batch as it is taken
        for made in numpy_views():
            made = dict(zip(made, map(torch.from_numpy, made.values()), strict=True))
            sum(values.nbytes for values in made.values())

    def read_tensors_cut_ahead() -> None:  # the loader before: a chunk's tensors at once
        pieces = [values.unsafe_split(batch) for values in tensors]
        for made in [dict(zip(names, row, strict=True)) for row in zip(*pieces, strict=True)]:
            sum(values.nbytes for values in made.values())

    ways = {
        "numpy views": read_numpy,
        "numpy views + torch.from_numpy a column": read_from_numpy,
        "tensor views cut a chunk ahead (unsafe_split)": read_tensors_cut_ahead,
    }
    cells = []
    for label, way in ways.items():
        us = min(timeit.repeat(way, number=5, repeat=7)) / (5 * 128) * 1e6
        cells.append([label, us])
    title = f"\n{columns} float32 columns, batch {batch}: a batch's views made, read and freed"
    lines = [title, f"{'way':50} {'us a batch':>10}"]
    lines += [f"{label:50} {us:>10.1f}" for label, us in cells]
    bench_table.print_table(
        f"views {columns}", title, ["way", "us a batch"], cells, text="\n".join(lines)
    )


def median_rounds(readers: list[tuple], specs: dict, rounds: int, work: Path, envs: dict) -> dict:
    """{label: [result of each round]}: every reader once a round, each round starting
    one reader later, so that none always runs first or after the same neighbour."""
    results: dict = {label: [] for label, *_ in readers}
    for round_ in range(rounds):
        for i in range(len(readers)):
            label = readers[(i + round_) % len(readers)][0]
            results[label].append(run_wide_reader(specs[label], work, envs[label]))
    return results


WIDE_COLUMNS = ("reader", "rows/s", "vs loop", "vs stack loop", "+RSS MiB", "CPU s")


def print_wide_table(key: str, title: str, readers: list[tuple], results: dict) -> None:
    """Medians: rows/s, against the plain loop, +RSS, CPU s (loop-stack: against itself)."""
    import statistics

    def median(label: str, index: int) -> float:
        return statistics.median(result[index] for result in results[label])

    def rate(label: str) -> float:
        return statistics.median(r[0] / r[2] for r in results[label])

    loop = rate(readers[0][0])
    stacked_loop = rate("plain loop, torch, stacked per row group")
    header = (
        f"{'reader':52} {'rows/s':>11} {'vs loop':>8} {'vs stack loop':>13} "
        f"{'+RSS MiB':>9} {'CPU s':>6}"
    )
    lines = [title, header, "-" * len(header)]
    cells = []
    for label, *_ in readers:
        r = rate(label)
        lines.append(
            f"{label:52} {r:>11,.0f} {r / loop:>8.2f} {r / stacked_loop:>13.2f} "
            f"{median(label, 3):>9.0f} {median(label, 4):>6.2f}"
        )
        cells.append([label, r, r / loop, r / stacked_loop, median(label, 3), median(label, 4)])
    bench_table.print_table(key, title, WIDE_COLUMNS, cells, text="\n".join(lines))


def wide_benchmark(args, work: Path) -> None:
    """The wide shape (`--columns` scalar columns) beside the array shape, one rank."""
    from sparkdist.data import make_spark_converter

    counts = [int(n) for n in str(args.columns).split(",")]
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    spark = start_spark()
    tables = {}
    try:
        for count in counts:
            # The same bytes for every count (2M rows at 64 columns): the rows shrink as the
            # columns grow, so that only the number of columns changes what a row costs.
            rows = min(args.wide_rows, args.wide_rows * 64 // count)
            handles, files = {}, []
            for shape, generate in (("wide", generate_wide), ("array", generate_array)):
                source = work / f"{shape}-{count}"
                generate(spark, rows, count, args.partitions).write.parquet(str(source))
                converter = make_spark_converter(spark.read.parquet(str(source)))
                handles[shape] = work / f"{shape}-{count}.pkl"
                handles[shape].write_bytes(pickle.dumps(converter))
                if shape == "wide":
                    files = sorted(str(p) for p in source.glob("*.parquet"))
            tables[count] = (rows, handles, files)
    finally:
        spark.stop()
    base_env = {**env, "PYTHONPATH": str(Path(args.baseline or ROOT).resolve())}
    for count, (rows, handles, files) in tables.items():
        tensor_views_floor(count + 2, args.batch_size)
        readers = chosen_readers(wide_readers(args.workers), args.only)
        baseline = baseline_wide_readers(readers) if args.baseline else []
        envs = {label: env for label, *_ in readers} | {label: base_env for label, *_ in baseline}
        readers += baseline
        features = [f"f{i}" for i in range(count)]
        specs = {
            label: {
                "kind": kind,
                "batch": args.batch_size,
                "files": files,
                "features": features,
                "handle": str(handles[shape]),
                "options": options,
            }
            for label, shape, kind, options in readers
        }
        results = median_rounds(readers, specs, args.rounds, work, envs)
        print_wide_table(
            f"wide {count}",
            f"\n{rows:,} rows x (id, label, {count} float32 columns), {len(files)} files written "
            f"by Spark, read in place; batch {args.batch_size}; one rank; medians of "
            f"{args.rounds} interleaved rounds; {os.cpu_count()} cores",
            readers,
            results,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8_400_000)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--streaming-rows", type=int, default=400_000)
    parser.add_argument("--codecs", action="store_true", help="measure the copy's codecs instead")
    parser.add_argument(
        "--wide", action="store_true", help="only the wide shape (scalar columns), one rank"
    )
    parser.add_argument(
        "--columns", default="64", help="the wide shape's float32 columns, e.g. 1,16,64,256"
    )
    parser.add_argument("--wide-rows", type=int, default=2_000_000, help="rows at 64 columns")
    parser.add_argument(
        "--workers",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1 << i for i in range(8) if 1 << i <= (os.cpu_count() or 1)],
        help="workers_count of the scaling rows (default: 1, 2, 4, ... up to the cores)",
    )
    parser.add_argument("--codec-rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of the loop and sparkdist's readers"
    )
    parser.add_argument(
        "--petastorm-python", default=str(ROOT / ".venv-petastorm" / "bin" / "python")
    )
    parser.add_argument("--workdir", default=None, help="where to write (default: the temp dir)")
    parser.add_argument(
        "--baseline", default=None, help="another checkout whose readers run side by side"
    )
    parser.add_argument(
        "--only", default=None, help="the wide readers whose label holds one of these words"
    )
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = Path(tempfile.mkdtemp(prefix="sparkdist-bench-data-", dir=args.workdir))
    try:
        if args.codecs:
            codec_benchmark(args, work)
        elif args.wide:
            wide_benchmark(args, work)
        else:
            main_benchmark(args, work)
            wide_benchmark(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
