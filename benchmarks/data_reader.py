"""Rows per second per rank: sparkdist's pyarrow reader vs a plain pyarrow loop vs petastorm.

    .venv/bin/python benchmarks/data_reader.py [--rows 300000] [--features 64]

Spark (local[2]) writes a generated DataFrame (a float vector and an int label) once
through ``make_spark_converter``. Each reader then reads the same Parquet files, one
shard per rank (ranks timed one after another, in this process), turning every batch
into numpy arrays (or tensors for the loaders). The plain loop reads *all* files with
``ParquetFile.iter_batches(batch_size)`` and turns each batch's columns into numpy: what
a hand-written reader does, and the reference for the ratio. The same loop with
16384-row batches (no batching for training at all) shows the decoding ceiling. petastorm
needs pyarrow < 15 and numpy < 2, so it runs in a separate interpreter
(``--petastorm-python``, default .venv-petastorm/bin/python from ``make petastorm-side``)
when one exists.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

PETASTORM_SCRIPT = """
import json, sys, time, warnings
warnings.simplefilter("ignore")
from petastorm import make_batch_reader
from petastorm.pytorch import BatchedDataLoader, DataLoader

files, batch_size, shard_count, repeats = json.loads(sys.argv[1])
results = []
for name, loader in [("DataLoader", DataLoader), ("BatchedDataLoader", BatchedDataLoader)]:
    for shard in range(shard_count):
        best = None
        for _ in range(repeats):
            kwargs = {"cur_shard": shard, "shard_count": shard_count} if shard_count > 1 else {}
            start, rows = time.perf_counter(), 0
            # workers_count=4: what petastorm's make_torch_dataloader uses by default.
            with make_batch_reader(files, num_epochs=1, workers_count=4,
                                   shuffle_row_groups=False, **kwargs) as reader:
                for batch in loader(reader, batch_size=batch_size):
                    rows += len(batch["label"])
            seconds = time.perf_counter() - start
            best = min(best or (rows, seconds), (rows, seconds), key=lambda r: r[1])
        results.append([name, shard, *best])
print(json.dumps(results))
"""


def best_of(repeats: int, measure) -> tuple[int, float]:
    """(rows, seconds) of the fastest of ``repeats`` runs: the machine is shared."""
    runs = [measure() for _ in range(repeats)]
    return min(runs, key=lambda run: run[1])


def plain_pyarrow_loop(files: list[str], batch_size: int) -> tuple[int, float]:
    """Every file, ``iter_batches(batch_size)``, each batch's columns to numpy."""
    from sparkdist.data.fs import filesystem_and_path

    start, rows = time.perf_counter(), 0
    for url in files:
        filesystem, path = filesystem_and_path(url)
        parquet = pq.ParquetFile(filesystem.open_input_file(path))
        for batch in parquet.iter_batches(batch_size):
            features = batch.column("features")
            values = features.flatten().to_numpy(zero_copy_only=False)
            arrays = {
                "features": values.reshape(len(features), -1),
                "label": batch.column("label").to_numpy(zero_copy_only=False),
            }
            rows += len(arrays["label"])
    return rows, time.perf_counter() - start


def sparkdist_reader(converter, batch_size: int, shard: int, shard_count: int):
    from sparkdist.data.reader import ShardReader

    def measure() -> tuple[int, float]:
        reader = ShardReader(
            converter.layout,
            batch_size=batch_size,
            num_epochs=1,
            cur_shard=shard,
            shard_count=shard_count,
        )
        start = time.perf_counter()
        rows = sum(len(batch["label"]) for batch in reader)
        return rows, time.perf_counter() - start

    return measure


def sparkdist_torch(converter, batch_size: int, shard: int, shard_count: int):
    def measure() -> tuple[int, float]:
        start, rows = time.perf_counter(), 0
        with converter.make_torch_dataloader(
            batch_size=batch_size, num_epochs=1, cur_shard=shard, shard_count=shard_count
        ) as loader:
            for batch in loader:
                rows += len(batch["label"])
        return rows, time.perf_counter() - start

    return measure


def petastorm_rows(
    python: str, files: list[str], batch_size: int, shard_count: int, repeats: int
) -> list[tuple[str, int, int, float]] | str:
    if not os.access(python, os.X_OK):
        return "n/a (petastorm not installable here)"
    args = json.dumps([files, batch_size, shard_count, repeats])
    result = subprocess.run(
        [python, "-c", PETASTORM_SCRIPT, args], capture_output=True, text=True, timeout=1200
    )
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["?"])[-1]
        return f"n/a (petastorm failed: {last[:80]})"
    return [tuple(row) for row in json.loads(result.stdout.strip().splitlines()[-1])]


def build_converter(rows: int, features: int, partitions: int, cache_dir: str):
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from sparkdist.data import make_spark_converter

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("sparkdist-bench-data-reader")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    vector = F.array(*[F.rand(seed=i) for i in range(features)])
    df = (
        spark.range(rows, numPartitions=partitions)
        .select((F.col("id") % 10).alias("label"), vector.alias("features"))
        .repartition(partitions)
    )
    return spark, make_spark_converter(df, cache_dir_url=Path(cache_dir).as_uri())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--petastorm-python",
        default=str(Path(__file__).resolve().parents[1] / ".venv-petastorm" / "bin" / "python"),
    )
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    cache_dir = tempfile.mkdtemp(prefix="sparkdist-bench-")
    try:
        spark, converter = build_converter(args.rows, args.features, args.partitions, cache_dir)
        spark.stop()  # the readers do not need Spark
        files = converter.file_urls
        size_mb = sum(os.path.getsize(f[len("file://") :]) for f in files) / 2**20
        print(
            f"{len(converter)} rows x ({args.features} float32 + label), {len(files)} files, "
            f"{converter.layout.num_row_groups} row groups, {size_mb:.0f} MiB uncompressed "
            f"Parquet; batch {args.batch_size}; best of {args.repeats}; {args.ranks} ranks "
            f"read one after another"
        )

        base_rows, base_s = best_of(
            args.repeats, lambda: plain_pyarrow_loop(files, args.batch_size)
        )
        baseline = base_rows / base_s
        table = [("plain pyarrow loop (all files)", "-", base_rows, base_s)]
        ceiling = best_of(args.repeats, lambda: plain_pyarrow_loop(files, 16384))
        table.append(("  same, 16384-row batches (ceiling)", "-", *ceiling))
        for label, make in [
            ("sparkdist pyarrow reader (numpy)", sparkdist_reader),
            ("sparkdist torch loader (tensors)", sparkdist_torch),
        ]:
            for shard in range(args.ranks):
                measure = make(converter, args.batch_size, shard, args.ranks)
                table.append((label, str(shard), *best_of(args.repeats, measure)))
        petastorm = petastorm_rows(
            args.petastorm_python, files, args.batch_size, args.ranks, args.repeats
        )
        if isinstance(petastorm, str):
            table.append(("petastorm (torch DataLoader)", "-", None, None, petastorm))
        else:
            for loader, shard, rows, seconds in petastorm:
                table.append((f"petastorm 0.13.1 {loader}", str(shard), rows, seconds))

        header = (
            f"{'reader':38} {'rank':>4} {'rows':>9} {'seconds':>8} {'rows/s':>11} {'vs loop':>8}"
        )
        print(header)
        print("-" * len(header))
        for row in table:
            label, rank, rows, seconds = row[:4]
            if rows is None:
                print(f"{label:38} {rank:>4} {row[4]}")
                continue
            rate = rows / seconds
            print(
                f"{label:38} {rank:>4} {rows:>9} {seconds:>8.3f} {rate:>11,.0f} "
                f"{rate / baseline:>8.2f}"
            )
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
