"""Does sparkdist's torch loader keep a GPU fed? Batches per second into device memory.

    python benchmarks/gpu_feed.py [--device cuda] [--rows 200000] [--features 256]
                                  [--columns 64] [--workers 1,2] [--shuffle]

Two shapes, each one Parquet file written with pyarrow (no Spark: the loader reads it as
it reads a converter's copy), batches of `--batch-size`, each consumed on the device by a
small step (a matmul and a sum), the device synchronised at the end:

* array: a float32 array of `--features` and an int64 label a row;
* wide: `--columns` float32 scalar columns and the label (a Spark table's usual shape),
  stacked into one `[batch, columns]` tensor on the device for the step.

The readers, taking turns in each round:

* link floor: one page-locked batch copied again and again (`non_blocking`), no reading:
  what the link carries at this batch size;
* host floor: pyarrow's own decode of the file with all cores (`read_table`, threads on,
  each column to numpy), nothing moved: what the host side can assemble at most;
* plain loop: pyarrow `iter_batches`, each column to numpy, `torch.from_numpy`,
  `.to(device)`: the reference;
* sparkdist, CPU batches: `make_torch_dataloader`, each tensor `.to(device)` in the loop;
* sparkdist, pin_memory: the DataLoader pins, the loop copies with `non_blocking=True`;
* sparkdist, device= (auto): `make_torch_dataloader(device=...)`: the faster of the
  ring and a plain `.to()` a column, timed on the first chunks (`device_feed`);
* sparkdist, device=, the ring forced (`device_feed="ring"`): each chunk (several
  batches) gathered into a slot of a ring of page-locked buffers, copied in one piece on
  a side stream, cut into batches on the device;
* wide only, sparkdist, features= and device= (auto, and the ring forced): the columns
  stacked in the decode workers into one `[batch, columns]` tensor, then device=.

sparkdist's rows run once for each count of decode threads in `--workers` (a column
each; `workers_count`), the others once. `--shuffle` shuffles sparkdist's reads (the
decode threads gather the rows of a window in parallel; the plain loop stays in order).
Each row is the best of `--rounds`. The last line is JSON (`{"figure": ...}`, each row's
best in GB/s of feature bytes) for `make gpu-check`.
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


def write_data(directory: Path, rows: int, features: int, columns: int) -> dict[str, str]:
    """The two shapes' files: {"array": url, "wide": url} (wide only if `columns`)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    values = np.random.default_rng(0).random(rows * features, dtype=np.float32)
    column = pa.ListArray.from_arrays(
        pa.array(np.arange(0, rows * features + 1, features, dtype=np.int32)), pa.array(values)
    )
    label = pa.array(np.arange(rows, dtype=np.int64))
    urls = {}
    for shape, table in (
        ("array", pa.table({"x": column, "label": label})),
        ("wide", _wide_table(rows, columns, label) if columns else None),
    ):
        if table is None:
            continue
        (directory / shape).mkdir()
        pq.write_table(table, directory / shape / "part-00000.parquet", row_group_size=8192)
        urls[shape] = (directory / shape).as_uri()
    return urls


def _wide_table(rows: int, columns: int, label):
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(1)
    data = {f"f{i}": rng.random(rows, dtype=np.float32) for i in range(columns)}
    return pa.table({**data, "label": label})


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


def link_floor(batch_bytes: int, batches: int, step: Step) -> int:
    """One page-locked batch copied `batches` times: the link's rate, nothing read."""
    import torch

    pinned = torch.empty(batch_bytes // 4, dtype=torch.float32)
    if step.device.type == "cuda":
        pinned = pinned.pin_memory()
    flat = pinned.view(-1, step.weight.shape[0])
    for _ in range(batches):
        step(flat.to(step.device, non_blocking=True))
    return batches


def host_floor(path: Path, batch_size: int, step: Step) -> int:
    """pyarrow's decode of the whole file on every core, each column to numpy, nothing
    moved: the host's floor, counted in batches of `batch_size`."""
    import pyarrow.parquet as pq

    table = pq.read_table(path, use_threads=True)
    for column in table.columns:
        chunks = column.chunks
        for chunk in chunks:
            (chunk.values if hasattr(chunk, "values") else chunk).to_numpy(zero_copy_only=False)
    return -(-table.num_rows // batch_size)


def plain_loop(path: Path, batch_size: int, step: Step, wide: bool) -> int:
    import pyarrow.parquet as pq
    import torch

    batches = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size):
        if wide:  # a tensor a column, stacked on the device
            features = [
                torch.from_numpy(batch.column(i).to_numpy()).to(step.device)
                for i in range(batch.num_columns - 1)
            ]
            step(torch.stack(features, 1))
        else:
            x = batch.column(0)
            flat = x.values.to_numpy(zero_copy_only=False).reshape(len(x), -1)
            step(torch.from_numpy(flat).to(step.device))
        batches += 1
    return batches


def sparkdist_loop(
    handle, batch_size: int, step: Step, how: str, columns: list[str], read: dict
) -> int:
    """`how`: cpu, pin_memory, device, ring (device= with the ring forced), features or
    features-ring (features= and device=); `read`: the loader's other options
    (workers_count, shuffle)."""
    import torch

    options: dict = {"pin_memory": True} if how == "pin_memory" else {}
    if how in ("device", "ring", "features", "features-ring"):
        options = {"device": step.device}
    if how.endswith("ring"):
        options["device_feed"] = "ring"
    if how.startswith("features"):
        options["features"] = {"x": columns}
    batches = 0
    loader_of = handle.make_torch_dataloader
    with loader_of(batch_size=batch_size, num_epochs=1, **options, **read) as loader:
        for batch in loader:
            tensors = (
                [batch["x"]]
                if not columns or how.startswith("features")
                else [batch[c] for c in columns]
            )
            if how in ("cpu", "pin_memory"):
                tensors = [t.to(step.device, non_blocking=how == "pin_memory") for t in tensors]
            step(tensors[0] if len(tensors) == 1 else torch.stack(tensors, 1))
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


def cases_of(shape: str, url: str, args, columns: list[str], workers: int | None) -> dict:
    """The readers of one shape, by row name: with `workers`, sparkdist's only, with that
    many decode threads; else the others."""
    path = Path(url.removeprefix("file://"), "part-00000.parquet")
    handle = converter(url)
    wide = shape == "wide"
    features = len(columns) if wide else args.features
    count = -(-args.rows // args.batch_size)
    if workers is None:
        return {
            "link floor (one pinned batch, copied)": lambda s: link_floor(
                args.batch_size * features * 4, count, s
            ),
            "host floor (pyarrow decode, all cores)": lambda s: host_floor(
                path, args.batch_size, s
            ),
            "plain loop (pyarrow to tensor, .to)": lambda s: plain_loop(
                path, args.batch_size, s, wide
            ),
        }
    read = {"workers_count": workers, "shuffle": args.shuffle}
    cases = {}
    for name, how in (
        ("sparkdist, CPU batches, .to", "cpu"),
        ("sparkdist, pin_memory, non_blocking", "pin_memory"),
        ("sparkdist, device= (auto)", "device"),
        ("sparkdist, device=, the ring forced", "ring"),
        *((("sparkdist, features= and device= (auto)", "features"),) if wide else ()),
        *((("sparkdist, features= and device=, the ring", "features-ring"),) if wide else ()),
    ):
        cases[name] = lambda s, how=how: sparkdist_loop(
            handle, args.batch_size, s, how, columns if wide else [], read
        )
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if any)")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--columns", type=int, default=64, help="wide shape (0: none)")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", default="1,2", help="decode threads, a column each")
    parser.add_argument("--shuffle", action="store_true", help="sparkdist's reads shuffled")
    args = parser.parse_args()
    counts = [int(count) for count in args.workers.split(",")]
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    warnings.filterwarnings("ignore", message=".*(not writable|pin_memory).*")
    columns = [f"f{i}" for i in range(args.columns)]
    rates: dict[str, dict[str, dict]] = {}  # shape -> row -> workers (None: n/a) -> rate
    with tempfile.TemporaryDirectory(prefix="sparkdist-gpu-feed-") as tmp:
        urls = write_data(Path(tmp), args.rows, args.features, args.columns)
        for shape, url in urls.items():
            width = args.features if shape == "array" else args.columns
            for workers in [None, *counts]:
                cases = cases_of(shape, url, args, columns, workers)
                for name, rate in measure(cases, device, width, args.rounds).items():
                    rates.setdefault(shape, {}).setdefault(name, {})[workers] = rate
    order = " shuffled" if args.shuffle else ""
    head = f"{args.rows} rows, batches of {args.batch_size}{order}, into {device}"
    title = f"{head} (torch {torch.__version__}), best of {args.rounds}"
    cells = _cells(rates, counts, args.batch_size, {"array": args.features, "wide": args.columns})
    columns_out = ["loader", *[f"batches/s, {n} workers" for n in counts], "MB/s (best)"]
    lines = [
        f"{'shape: loader':<62}"
        + "".join(f" {f'{n} workers':>10}" for n in counts)
        + f" {'MB/s':>8}"
    ]
    lines += [f"{row[0]:<62}" + "".join(f" {_rate(cell):>10}" for cell in row[1:]) for row in cells]
    bench_table.print_table(device, title, columns_out, cells, text=title + "\n" + "\n".join(lines))
    widths = {"array": args.features, "wide": args.columns}
    figure = f"GB/s into {device}: " + "; ".join(
        f"{shape}: "
        + ", ".join(
            f"{_short(name)} {max(by.values()) * args.batch_size * widths[shape] * 4 / 1e9:.2f}"
            for name, by in by_name.items()
        )
        for shape, by_name in rates.items()
    )
    print(json.dumps({"figure": figure, "rates": rates, "device": device}))


def _cells(rates: dict, counts: list[int], batch_size: int, widths: dict) -> list[list]:
    """The table's rows: a row's batches/s for each count of workers ("-" where it has
    none), and its best rate in MB/s."""
    cells = []
    for shape, by_name in rates.items():
        for name, by_workers in by_name.items():
            best = max(by_workers.values())
            row = [f"{shape} ({widths[shape]} float32): {name}"]
            alone = by_workers.get(None, "-")  # no decode threads: under the first count
            row += [by_workers.get(n, alone if i == 0 else "-") for i, n in enumerate(counts)]
            cells.append([*row, best * batch_size * widths[shape] * 4 / 1e6])
    return cells


def _rate(cell: object) -> str:
    return f"{cell:.1f}" if isinstance(cell, float) else str(cell)


def _short(name: str) -> str:
    return name.split(" (")[0].removeprefix("sparkdist, ")


if __name__ == "__main__":
    main()
