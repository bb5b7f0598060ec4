"""Does sparkdist's torch loader keep a GPU fed? Batches per second into device memory.

    python benchmarks/gpu_feed.py [--device cuda] [--rows 200000] [--features 256]

One Parquet file of `--rows` rows (a float32 array of `--features` and an int64 label),
written with pyarrow (no Spark: the loader reads it as it reads a converter's copy). Each
row of the table is one epoch, batches of `--batch-size`, each consumed on the device by a
small step (a matmul and a sum), the device synchronised at the end:

* plain loop: pyarrow `iter_batches`, the array column to numpy, `torch.from_numpy`,
  `.to(device)`: the reference;
* sparkdist, CPU batches: `make_torch_dataloader`, each batch `.to(device)` in the loop;
* sparkdist, pin_memory: the DataLoader pins, the loop copies with `non_blocking=True`;
* sparkdist, device prefetch: `make_torch_dataloader(device=...)`: batches handed out on
  the device, copied a batch ahead on a side stream.

Each row is the best of `--rounds`, the loaders taking turns in each round. The last line
is JSON (`{"figure": ...}`) for `make gpu-check`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_table  # noqa: E402 (a sibling script, not a package)


def write_data(directory: Path, rows: int, features: int) -> str:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    values = np.random.default_rng(0).random(rows * features, dtype=np.float32)
    column = pa.ListArray.from_arrays(
        pa.array(np.arange(0, rows * features + 1, features, dtype=np.int32)), pa.array(values)
    )
    table = pa.table({"x": column, "label": pa.array(np.arange(rows, dtype=np.int64))})
    pq.write_table(table, directory / "part-00000.parquet", row_group_size=8192)
    return directory.as_uri()


def converter(url: str):
    from sparkdist.data.converter import SparkDatasetConverter
    from sparkdist.data.layout import describe

    return SparkDatasetConverter(url, describe(url), source="parquet", tensor_types="torch")


class Step:
    """What the device does with a batch: a matmul and a sum, accumulated."""

    def __init__(self, device: str, features: int) -> None:
        import torch

        self.device = torch.device(device)
        self.weight = torch.randn(features, 64, device=self.device)
        self.total = torch.zeros((), device=self.device)

    def __call__(self, x) -> None:
        self.total += (x @ self.weight).sum()

    def finish(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def plain_loop(path: Path, batch_size: int, step: Step) -> int:
    import pyarrow.parquet as pq
    import torch

    batches = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size, columns=["x", "label"]):
        x = batch.column(0)
        flat = x.values.to_numpy(zero_copy_only=False).reshape(len(x), -1)
        step(torch.from_numpy(flat).to(step.device))
        batches += 1
    return batches


def sparkdist_loop(handle, batch_size: int, step: Step, how: str) -> int:
    options = {"pin_memory": True} if how == "pin_memory" else {}
    if how == "prefetch":
        options = {"device": step.device}
    batches = 0
    with handle.make_torch_dataloader(batch_size=batch_size, num_epochs=1, **options) as loader:
        for batch in loader:
            x = batch["x"]
            if how != "prefetch":
                x = x.to(step.device, non_blocking=how == "pin_memory")
            step(x)
            batches += 1
    return batches


def measure(cases: dict, device: str, features: int, rounds: int) -> dict[str, float]:
    """Each case's best batches/s over `rounds` rounds, the cases taking turns in each
    round (a shared machine's load then weighs on all of them alike)."""
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, case in cases.items():
            step = Step(device, features)
            began = time.perf_counter()
            count = case(step)
            step.finish()
            best[name] = max(best.get(name, 0.0), count / (time.perf_counter() - began))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if any)")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    warnings.filterwarnings("ignore", message=".*(not writable|pin_memory).*")
    with tempfile.TemporaryDirectory(prefix="sparkdist-gpu-feed-") as tmp:
        url = write_data(Path(tmp), args.rows, args.features)
        handle = converter(url)
        cases = {
            "plain loop (pyarrow to tensor, .to)": lambda s: plain_loop(
                Path(tmp, "part-00000.parquet"), args.batch_size, s
            ),
            "sparkdist, CPU batches, .to": lambda s: sparkdist_loop(
                handle, args.batch_size, s, "cpu"
            ),
            "sparkdist, pin_memory, non_blocking": lambda s: sparkdist_loop(
                handle, args.batch_size, s, "pin_memory"
            ),
            "sparkdist, device prefetch": lambda s: sparkdist_loop(
                handle, args.batch_size, s, "prefetch"
            ),
        }
        shape = f"{args.rows} rows x {args.features} float32, batches of {args.batch_size}"
        print(f"{shape}, into {device} (torch {torch.__version__}), best of {args.rounds}")
        rates = measure(cases, device, args.features, args.rounds)
    batch_mb = args.batch_size * args.features * 4 / 1e6
    lines = [f"{'loader':<40} {'batches/s':>10} {'MB/s':>8}"]
    for name, rate in rates.items():
        lines.append(f"{name:<40} {rate:>10.1f} {rate * batch_mb:>8.0f}")
    cells = [[name, rate, rate * batch_mb] for name, rate in rates.items()]
    title = f"{shape}, into {device} (torch {torch.__version__}), best of {args.rounds}"
    columns = ["loader", "batches/s", "MB/s"]
    bench_table.print_table(device, title, columns, cells, text="\n".join(lines))
    short = ["plain loop", "CPU batches", "pin_memory", "prefetch"]
    figure = f"{device} batches/s: " + ", ".join(
        f"{label} {rate:.0f}" for label, rate in zip(short, rates.values(), strict=True)
    )
    print(json.dumps({"figure": figure, "rates": rates, "device": device}))


if __name__ == "__main__":
    main()
