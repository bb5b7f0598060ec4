"""What ``rank_split="per_step"`` costs a rank's read, against the default contiguous split.

    .venv/bin/python benchmarks/data_per_step.py [--rows 1200000] [--features 32] [--rounds 3]

Writes Parquet files with pyarrow (no Spark: 16 files of two row groups, a label and an
array column of ``--features`` float32, as Spark writes a DataFrame's vector column), then
reads one epoch as rank 0 of a world of 1 and of 3 ranks with ``global_batch_size=768``
(256 rows a rank a step at 3), shuffled and in the files' order, with each split. Rank 0
runs alone in this process, one decode thread (``workers_count=1``), the reader's prefetch
thread on: its rows/s and its CPU seconds (all its threads) per million rows it got. At 3
ranks the contiguous split reads a third of the row groups; per step the rank takes a
third of every step, so it decodes every window of the epoch (in order too: each row group
streamed once, the rank's rows picked out). The cases run ``--rounds`` rounds, each in
turn, and the median is shown (the machine is shared: compare side by side).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_table  # noqa: E402

from sparkdist.data.converter import SparkDatasetConverter  # noqa: E402
from sparkdist.data.layout import describe  # noqa: E402

GLOBAL_BATCH = 768
FILES, GROUPS = 16, 2


def write(directory: Path, rows: int, features: int) -> None:
    rng = np.random.default_rng(0)
    per_file = rows // FILES
    for index in range(FILES):
        values = rng.random(per_file * features, dtype=np.float32)
        offsets = np.arange(0, per_file * features + 1, features, dtype=np.int32)
        table = pa.table(
            {
                "label": np.arange(index * per_file, (index + 1) * per_file, dtype=np.int64),
                "features": pa.ListArray.from_arrays(offsets, values),
            }
        )
        pq.write_table(
            table, directory / f"part-{index:02d}.parquet", row_group_size=-(-per_file // GROUPS)
        )


def read_epoch(converter: SparkDatasetConverter, world: int, split: str, shuffle: bool) -> tuple:
    """Rank 0 of ``world`` reads one epoch: (rows it got, wall s, CPU s)."""
    options = {"global_batch_size": GLOBAL_BATCH, "rank_split": split, "shuffle": shuffle}
    wall, cpu, rows = time.perf_counter(), time.process_time(), 0
    with converter.make_numpy_batches(
        cur_shard=0, shard_count=world, num_epochs=1, seed=1, workers_count=1, **options
    ) as batches:
        for batch in batches:
            rows += len(batch["label"])
    return rows, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_200_000)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cases = [
        (order, world, split)
        for order in ("shuffled", "in order")
        for world in (1, 3)
        for split in ("contiguous", "per_step")
    ]
    results: dict = {case: [] for case in cases}
    with tempfile.TemporaryDirectory(prefix="sparkdist-per-step-") as work:
        write(Path(work), args.rows, args.features)
        converter = SparkDatasetConverter(None, describe(Path(work).as_uri()), source="parquet")
        read_epoch(converter, 1, "contiguous", True)  # warm the page cache
        for _ in range(args.rounds):
            for case in cases:
                order, world, split = case
                results[case].append(read_epoch(converter, world, split, order == "shuffled"))
    table = []
    for case, runs in results.items():
        rows = runs[0][0]
        wall = statistics.median(run[1] for run in runs)
        cpu = statistics.median(run[2] for run in runs)
        table.append([*case, rows, round(rows / wall), round(cpu / rows * 1e6, 2)])
    bench_table.print_table(
        "per_step",
        f"rank 0's read of one epoch, {args.rows} rows, global_batch_size={GLOBAL_BATCH}, "
        f"median of {args.rounds} rounds",
        ["order", "ranks", "rank_split", "rows", "rows/s", "CPU s per 1M rows"],
        table,
    )


if __name__ == "__main__":
    main()
