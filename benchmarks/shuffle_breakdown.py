"""Where a shuffled read's time goes: one rank, CPU seconds by stage, before and after.

    .venv/bin/python benchmarks/shuffle_breakdown.py [--rows 2000000] [--repeat 2]

pyarrow writes `--rows` rows (a label and 64 float32 features, snappy) in row groups of
500,000 rows (about 128 MiB, as Spark writes them); no Spark. One process reads every
window of one shuffled epoch and times each stage in CPU seconds (steadier than wall time
on a shared machine): making the window's order, Parquet decoding, Arrow to numpy, copying
the decoded rows into the window's buffer, and the gather in the epoch's order, either as
before (decoded and gathered in chunks of about 8 MiB, ``np.take`` into fresh numpy memory)
or as now (pieces of about 2 MiB, `row_block.gather` into memory from Arrow's pool; the same
rows in the same order), with the page faults each took. Then the whole loader: a plain
pyarrow loop, `ShardReader` in order and shuffled, rows/s and CPU seconds (the reader's
threads included).
"""

from __future__ import annotations

import argparse
import resource
import shutil
import tempfile
import time
from pathlib import Path

import bench_table  # a sibling script, not a package
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sparkdist.data.layout import Layout, describe
from sparkdist.data.rank import decode, order, reader, row_block

STAGES = ("order", "parquet decode", "to numpy", "copy to buffer", "gather")


def write(directory: Path, rows: int, features: int = 64) -> Layout:
    rng, per_file = np.random.default_rng(0), 1_000_000
    for index, first in enumerate(range(0, rows, per_file)):
        n = min(per_file, rows - first)
        values = pa.array(rng.random(n * features, dtype=np.float32))
        offsets = pa.array(np.arange(0, n * features + 1, features, dtype=np.int32))
        table = pa.table(
            {
                "label": np.arange(first, first + n, dtype=np.int64) % 10,
                "features": pa.ListArray.from_arrays(offsets, values),
            }
        )
        pq.write_table(table, directory / f"part-{index:03d}.parquet", row_group_size=500_000)
    return describe(directory.as_uri())


def fill(window: order.Window, decoder, buffers: dict, times: dict, piece: int) -> None:
    """Decode ``window`` into ``buffers`` (reused) ``piece`` rows at a time, timing the stages."""
    filled, padded = 0, window.rows
    for block in window.blocks:
        batches = decoder.batches(block, piece)
        while True:
            start = time.process_time()
            batch = next(batches, None)
            times["parquet decode"] += time.process_time() - start
            if batch is None:
                break
            start = time.process_time()
            chunk = decode.to_numpy_chunk(batch, decoder.columns)
            times["to numpy"] += time.process_time() - start
            start = time.process_time()
            for name, values in chunk.items():
                held = buffers.get(name)
                if held is None or len(held) < padded:
                    held = buffers[name] = np.empty((padded, *values.shape[1:]), values.dtype)
                held[filled : filled + len(values)] = values
            filled += len(values)
            times["copy to buffer"] += time.process_time() - start


def gather(epoch: order.EpochOrder, window, buffers, times, chunk_rows: int, how: str) -> None:
    """The window's rows in the epoch's order, ``chunk_rows`` at a time, as before or as now."""
    start = time.process_time()
    permutation = epoch.permutation(window)
    times["order"] += time.process_time() - start
    start = time.process_time()
    for first in range(0, window.rows, chunk_rows):
        picked = permutation[first : first + chunk_rows]
        if how == "before":
            {name: np.take(values, picked, axis=0) for name, values in buffers.items()}
        else:
            {name: row_block.gather(values, picked) for name, values in buffers.items()}
    times["gather"] += time.process_time() - start


def breakdown(layout: Layout, how: str) -> dict:
    shard = reader.ShardReader(layout, batch_size=256, num_epochs=1, shuffle=True, prefetch=0)
    decoder = shard._decoding
    epoch = order.EpochOrder(layout.row_group_rows, 0, 0, True, order.DEFAULT_WINDOW_ROWS)
    piece = decoder.chunk_rows if how == "before" else decoder.chunk_rows // 4
    times, buffers = dict.fromkeys(STAGES, 0.0), {}
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for window in epoch.windows:
        fill(window, decoder, buffers, times, piece)
        gather(epoch, window, buffers, times, piece, how)
    times["page faults"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return times


def cpu_of(times: dict) -> float:
    return sum(times[stage] for stage in STAGES)


def whole_reads(layout: Layout) -> list[tuple[str, int, float, float]]:
    def loop() -> int:
        rows = 0
        for url in layout.file_urls:
            for batch in pq.ParquetFile(url.removeprefix("file://")).iter_batches(256):
                features = batch.column("features")
                features.flatten().to_numpy().reshape(len(features), -1)
                rows += len(batch.column("label").to_numpy())
        return rows

    def loader(shuffle: bool):
        shard = reader.ShardReader(
            layout, batch_size=256, num_epochs=1, shuffle=shuffle, writable=True
        )
        return lambda: sum(len(batch["label"]) for batch in shard)

    out = []
    for label, read in (
        ("plain pyarrow loop", loop),
        ("ShardReader, in order", loader(False)),
        ("ShardReader, shuffle=True", loader(True)),
    ):
        wall, cpu = time.perf_counter(), time.process_time()
        rows = read()
        out.append((label, rows, time.perf_counter() - wall, time.process_time() - cpu))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=2, help="rounds; the least CPU is shown")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sparkdist-bench-shuffle-", dir=args.workdir))
    try:
        layout = write(work, args.rows)
        best: dict = {}
        for _ in range(args.repeat):
            for how in ("before", "now"):
                times = breakdown(layout, how)
                if how not in best or cpu_of(times) < cpu_of(best[how]):
                    best[how] = times
            for label, rows, wall, cpu in whole_reads(layout):
                if label not in best or cpu < best[label][2]:
                    best[label] = (rows, wall, cpu)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.rows} rows, {layout.row_bytes} B a row, row groups of 500,000 rows")
    print_stages(best, args.repeat)
    print_whole_reads(best)


def print_stages(best: dict, repeat: int) -> None:
    """CPU seconds by stage, before and now, and the page faults of each."""
    title = f"CPU seconds by stage, one shuffled epoch (least of {repeat})"
    lines, cells = [title, f"{'stage':16} {'before':>8} {'now':>8}"], []
    for stage in (*STAGES, "total"):
        values = [
            cpu_of(best[how]) if stage == "total" else best[how][stage] for how in ("before", "now")
        ]
        lines.append(f"{stage:16} {values[0]:>8.2f} {values[1]:>8.2f}")
        cells.append([stage, *values])
    faults = [best["before"]["page faults"], best["now"]["page faults"]]
    lines.append(f"{'page faults':16} {faults[0]:>8} {faults[1]:>8}")
    cells.append(["page faults", *faults])
    columns = ["stage", "before", "now"]
    bench_table.print_table("stages", title, columns, cells, text="\n".join(lines))


def print_whole_reads(best: dict) -> None:
    """The whole loader beside the plain loop: rows/s, CPU s, rows per CPU s."""
    title = "one rank, one epoch"
    lines = [f"\n{title:28} {'rows/s':>10} {'CPU s':>6} {'rows per CPU s':>15}"]
    cells = []
    for label in ("plain pyarrow loop", "ShardReader, in order", "ShardReader, shuffle=True"):
        rows, wall, cpu = best[label]
        lines.append(f"{label:28} {rows / wall:>10,.0f} {cpu:>6.2f} {rows / cpu:>15,.0f}")
        cells.append([label, rows / wall, cpu, rows / cpu])
    columns = ["reader", "rows/s", "CPU s", "rows per CPU s"]
    bench_table.print_table("whole reads", title, columns, cells, text="\n".join(lines))


if __name__ == "__main__":
    main()
