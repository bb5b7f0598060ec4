"""A real model's training step, timed three ways: what sparkdist costs a step on a GPU.

    python benchmarks/gpu_train.py [--model gpt2|tiny] [--steps 50] [--warmup 5] [--no-compile]

The model: a GPT-2-small-shaped decoder written here in plain torch (12 layers, 12 heads,
width 768, vocabulary 50257, sequence 1024: 124M parameters; `--model tiny`: 2 layers,
width 64, vocabulary 512, sequence 64, for CPUs), randomly initialised from seed 0, nothing
downloaded; bf16 autocast on CUDA, `F.scaled_dot_product_attention(is_causal=True)`,
`torch.compile` (`--no-compile` skips it; skipped on CPU), AdamW. It trains on token ids
from a Parquet file this script writes: one int32 array column `ids` of seq+1 ids a row,
a learnable pattern (each row counts from a random start by a random stride, modulo 256).

Each way runs in a process of its own (a fresh CUDA context), reads the same rows in the
same order (`warmup + steps` batches of one epoch) and runs the same step:

* floor: every token already in device memory, each batch a slice of it;
* pyarrow, .to: a plain `pyarrow` `iter_batches` loop, `torch.from_numpy`, then
  `.to(device, non_blocking=True)`, as a plain user writes it;
* sparkdist: `HorovodRunner(np=-1).run(main)` (the rank a process of this one's, no Spark);
  in the rank, inside `sparkdist.elastic.run` with a `TorchState` of the model and AdamW:
  the loader (`make_torch_dataloader(device=...)`), `sparkdist.report()` every step and
  `state.commit()` every 10 steps (and once at the end of the warm-up, so that the timed
  steps do not pay for the first allocation of the commit's host buffers);
* sparkdist, commit every step: the same with a commit after every step.

Every way fetches a step's loss (`.item()`) after it launched the next step, as a script
that logs its loss does, so the fetch never leaves the GPU idle.

Per way: tokens/s over the timed steps (between two `torch.cuda.synchronize()`), the step
time (median and p90; CUDA events at each step's start, so a step waiting for its batch
counts), MFU against the GPU's dense bf16 peak (989 TFLOPS for H100 SXM and H200, from
`torch.cuda.get_device_name()`; `--peak-tflops` overrides; n/a on CPU), and what the
training loop spent per step, measured with `perf_counter` around each call: blocked on
its next batch (the loader; for `.to` the copy too), in `report()` and in `commit()`. A
commit's time includes waiting for the step in flight: its check for a newer world reads
a flag back from the device.

FLOPs per token: 6 N + 12 L H Q T (nanoGPT's `estimate_mfu`, after the PaLM paper's
appendix B): N the parameters without the position embedding (the output layer is tied to
the token embedding), L layers, H heads, Q the head size, T the sequence length.

`--profile DIR` writes a Chrome trace of one more step a way (after the timed ones, so
the figures are not the profiler's) to `DIR/<way>.json`. A way that fails leaves the
others' rows (its own reads "failed", its error goes to stderr, the exit status is 1).
The table is printed (and written by `bench_table`) with each way's whole process time;
the last line is JSON (`{"figure": ...}`) for `make gpu-check`.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # sparkdist from this checkout (a GPU machine has no install)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402


@dataclass(frozen=True)
class Shape:
    layers: int
    heads: int
    width: int
    vocab: int
    seq: int


MODELS = {
    "gpt2": Shape(layers=12, heads=12, width=768, vocab=50257, seq=1024),
    "tiny": Shape(layers=2, heads=2, width=64, vocab=512, seq=64),
}
WAYS = {
    "floor": "floor: tokens in device memory",
    "pyarrow": "plain pyarrow loop, .to",
    "sparkdist": "sparkdist, commit every 10 steps",
    "sparkdist-each": "sparkdist, commit every step",
}
COMMIT_EVERY = {"sparkdist": 10, "sparkdist-each": 1}
PATTERN = 256
"""Token ids count modulo this (the learnable pattern stays inside any vocabulary)."""
PEAKS_TFLOPS = (("H100 PCIe", 756.0), ("H100", 989.0), ("H200", 989.0), ("A100", 312.0))
"""Dense bf16 peaks by device name (the first that the name contains)."""


class Block(nn.Module):
    """A GPT-2 block: pre-norm attention (SDPA, causal) and a 4x GELU MLP."""

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.heads = shape.heads
        self.norm1 = nn.LayerNorm(shape.width)
        self.qkv = nn.Linear(shape.width, 3 * shape.width)
        self.proj = nn.Linear(shape.width, shape.width)
        self.norm2 = nn.LayerNorm(shape.width)
        self.up = nn.Linear(shape.width, 4 * shape.width)
        self.down = nn.Linear(4 * shape.width, shape.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(batch, seq, width))
        return x + self.down(F.gelu(self.up(self.norm2(x)), approximate="tanh"))


class Decoder(nn.Module):
    """GPT-2's decoder: token and position embeddings, blocks, a final norm, the output
    layer tied to the token embedding; `forward` returns the mean cross-entropy."""

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.tokens = nn.Embedding(shape.vocab, shape.width)
        self.positions = nn.Embedding(shape.seq, shape.width)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.layers))
        self.norm = nn.LayerNorm(shape.width)
        self.head = nn.Linear(shape.width, shape.vocab, bias=False)
        self.head.weight = self.tokens.weight
        for name, parameter in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(parameter)
            elif parameter.dim() > 1:
                std = (
                    0.02 / (2 * shape.layers) ** 0.5
                    if name.endswith(("proj.weight", "down.weight"))
                    else 0.02
                )
                nn.init.normal_(parameter, std=std)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        places = torch.arange(ids.shape[1], device=ids.device)
        x = self.tokens(ids) + self.positions(places)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def flops_per_token(model: Decoder, shape: Shape) -> float:
    """6 N + 12 L H Q T (see the module's docstring)."""
    params = sum(p.numel() for p in model.parameters()) - model.positions.weight.numel()
    head_size = shape.width // shape.heads
    return 6.0 * params + 12.0 * shape.layers * shape.heads * head_size * shape.seq


def peak_tflops(device: torch.device, override: float | None) -> float | None:
    """The device's dense bf16 peak in TFLOPS (None: unknown, MFU n/a)."""
    if override is not None:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for part, peak in PEAKS_TFLOPS if part in name), None)


def write_tokens(path: Path, rows: int, seq: int, batch: int) -> None:
    """`rows` rows of seq+1 int32 ids in one array column: start + stride * i, mod PATTERN;
    row groups of whole batches (pyarrow's `iter_batches` cuts a batch at a group's end)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    start = rng.integers(0, PATTERN, size=(rows, 1))
    stride = rng.integers(1, 8, size=(rows, 1))
    ids = ((start + stride * np.arange(seq + 1)) % PATTERN).astype(np.int32)
    offsets = pa.array(np.arange(0, rows * (seq + 1) + 1, seq + 1, dtype=np.int32))
    column = pa.ListArray.from_arrays(offsets, pa.array(ids.reshape(-1)))
    pq.write_table(pa.table({"ids": column}), path, row_group_size=batch * max(1, 1024 // batch))


@dataclass(frozen=True)
class Run:
    """What one way's process runs (passed to it as JSON)."""

    way: str
    model: str
    seq: int
    batch: int
    warmup: int
    steps: int
    compile: bool
    device: str
    data: str
    """The Parquet file of token ids."""
    profile: str | None = None
    """A folder for a Chrome trace of one step after the timed ones (None: no trace)."""


def shape_of(run: Run) -> Shape:
    base = MODELS[run.model]
    return Shape(base.layers, base.heads, base.width, base.vocab, run.seq)


def make_step(run: Run) -> tuple[Decoder, torch.optim.Optimizer, Callable]:
    """The model (seed 0), AdamW, and the step: a batch of seq+1 ids in, its loss out."""
    device = torch.device(run.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(0)
    model = Decoder(shape_of(run)).to(device)
    lr = 6e-4 if run.model == "gpt2" else 3e-3
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=device.type == "cuda")
    forward = torch.compile(model) if run.compile else model
    cuda = device.type == "cuda"

    def step(ids: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext():
            loss = forward(ids[:, :-1].long(), ids[:, 1:].long())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return model, optimizer, step


class StepClock:
    """Each timed step's start: a CUDA event on the device's timeline (a step that waits
    for its batch counts the wait), else `perf_counter`."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def step_ms(self) -> list[float]:
        """Each step's milliseconds (after the device was synchronised)."""
        pairs = itertools.pairwise(self.marks)
        if self.cuda:
            return [begun.elapsed_time(ended) for begun, ended in pairs]
        return [(ended - begun) * 1e3 for begun, ended in pairs]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


Costs = dict[str, float]
"""Seconds a call took, by name ("report", "commit")."""


def train(
    run: Run,
    batches: Iterator[torch.Tensor],
    step: Callable[[torch.Tensor], torch.Tensor],
    after: Callable[[int, float | None], Costs] | None = None,
) -> dict:
    """The loop every way runs: `warmup` steps, then `steps` timed ones. `after(i, loss)`
    runs after step i is launched (`loss`: the step before's, fetched then)."""
    device = torch.device(run.device)
    clock, costs = StepClock(device), {"loader": [], "report": [], "commit": []}
    losses: list[float] = []
    checksum, previous = torch.zeros((), dtype=torch.int64, device=device), None
    began = time.perf_counter()
    for i in range(run.warmup + run.steps):
        if i == run.warmup:
            synchronize(device)
            began = time.perf_counter()
            for values in costs.values():
                values.clear()
        if i >= run.warmup:
            clock.mark()
        asked = time.perf_counter()
        ids = next(batches)
        costs["loader"].append(time.perf_counter() - asked)
        if tuple(ids.shape) != (run.batch, run.seq + 1):
            raise ValueError(f"{run.way}: batch {i} has shape {tuple(ids.shape)}")
        checksum += ids.sum(dtype=torch.int64) * (i + 1)
        loss = step(ids)
        if previous is not None:
            losses.append(previous.item())
        for name, seconds in (after(i, losses[-1] if losses else None) if after else {}).items():
            costs[name].append(seconds)
        previous = loss
    clock.mark()
    synchronize(device)
    seconds = time.perf_counter() - began
    losses.append(previous.item())
    if run.profile:
        profile_step(run, batches, step, after, losses[-1])
    return summary(run, seconds, clock.step_ms(), costs, losses, int(checksum.item()))


def profile_step(
    run: Run,
    batches: Iterator[torch.Tensor],
    step: Callable[[torch.Tensor], torch.Tensor],
    after: Callable[[int, float | None], Costs] | None,
    loss: float,
) -> None:
    """One more step (the batch after the timed ones, its `after` too) under torch's
    profiler, written as `<profile>/<way>.json`: where a step's time goes."""
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(run.device)
    activities = [ProfilerActivity.CPU]
    activities += [ProfilerActivity.CUDA] if device.type == "cuda" else []
    with profile(activities=activities) as profiler:
        step(next(batches))
        if after:
            after(run.warmup + run.steps, loss)
        synchronize(device)
    Path(run.profile).mkdir(parents=True, exist_ok=True)
    profiler.export_chrome_trace(str(Path(run.profile, f"{run.way}.json")))


def summary(
    run: Run, seconds: float, step_ms: list[float], costs: dict, losses: list, checksum: int
) -> dict:
    """One way's figures (milliseconds; the loader's and report's per step, a commit's
    per commit)."""
    import numpy as np

    return {
        "way": run.way,
        "tokens_per_s": run.steps * run.batch * run.seq / seconds,
        "step_ms_median": float(np.median(step_ms)),
        "step_ms_p90": float(np.percentile(step_ms, 90)),
        "loader_ms": 1e3 * sum(costs["loader"]) / run.steps,
        "report_ms": 1e3 * sum(costs["report"]) / run.steps if costs["report"] else None,
        "commit_ms": 1e3 * sum(costs["commit"]) / len(costs["commit"]) if costs["commit"] else None,
        "commits": len(costs["commit"]),
        "losses": losses,
        "checksum": checksum,
    }


def floor_way(run: Run) -> dict:
    """Every token in device memory up front; each batch a slice."""
    import pyarrow.parquet as pq

    _, _, step = make_step(run)
    column = pq.read_table(run.data, columns=["ids"]).column("ids").combine_chunks()
    flat = column.flatten().to_numpy().reshape(len(column), -1)
    tokens = torch.from_numpy(flat).to(run.device)
    synchronize(torch.device(run.device))
    batches = (tokens[i : i + run.batch] for i in range(0, len(tokens), run.batch))
    return train(run, batches, step)


def pyarrow_way(run: Run) -> dict:
    """A plain user's loop: pyarrow batches to numpy, `torch.from_numpy`, `.to()`."""
    import pyarrow.parquet as pq

    _, _, step = make_step(run)
    device = torch.device(run.device)

    def batches() -> Iterator[torch.Tensor]:
        reader = pq.ParquetFile(run.data)
        for record in reader.iter_batches(batch_size=run.batch, columns=["ids"]):
            column = record.column(0)
            flat = column.flatten().to_numpy().reshape(len(column), -1)
            yield torch.from_numpy(flat).to(device, non_blocking=True)

    return train(run, batches(), step)


def sparkdist_way(run: Run) -> dict:
    """The rank a process of this one (`np=-1`, the direct launcher: no Spark)."""
    from sparkdist import HorovodRunner

    runner = HorovodRunner(np=-1, launcher="direct")
    return runner.run(rank_entry, script=str(Path(__file__).resolve()), run=asdict(run))


def rank_entry(script: str, run: dict) -> dict:
    """What the rank runs: this script imported as a module (sent by value, its model
    and loop would drag torch's module objects into the pickle), then `sparkdist_main`."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_train", script)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_train"] = module
    spec.loader.exec_module(module)
    return module.sparkdist_main(run)


def sparkdist_main(run: dict) -> dict:
    """In the rank: `elastic.run` with the model and AdamW in a `TorchState`, sparkdist's
    loader into the device, a report every step and a commit every `COMMIT_EVERY` steps."""
    import sparkdist
    from sparkdist import elastic
    from sparkdist.data.converter import SparkDatasetConverter
    from sparkdist.data.layout import describe

    run = Run(**run)
    model, optimizer, step = make_step(run)
    state = elastic.TorchState(model=model, optimizer=optimizer)
    url = Path(run.data).parent.as_uri()
    handle = SparkDatasetConverter(url, describe(url), source="parquet", tensor_types="torch")
    every, tokens = COMMIT_EVERY[run.way], run.batch * run.seq

    def after(i: int, loss: float | None) -> Costs:
        asked = time.perf_counter()
        sparkdist.report(
            {"tokens": (i + 1) * tokens, **({"loss": loss} if loss is not None else {})}, i
        )
        costs = {"report": time.perf_counter() - asked}
        if (i + 1) % every == 0 or i + 1 == run.warmup:
            asked = time.perf_counter()
            state.commit()
            costs["commit"] = time.perf_counter() - asked
        return costs

    @elastic.run
    def in_world(state: elastic.TorchState) -> dict:
        options = {"batch_size": run.batch, "num_epochs": 1, "device": run.device}
        with handle.make_torch_dataloader(**options) as loader:
            return train(run, (batch["ids"] for batch in loader), step, after)

    return in_world(state)


RUNS = {"floor": floor_way, "pyarrow": pyarrow_way, "sparkdist": sparkdist_way}
RUNS["sparkdist-each"] = sparkdist_way


def child_environment() -> dict[str, str]:
    """sparkdist from this tree for the way's process and its rank; TLS only if it can (a
    GPU machine may lack `cryptography`: every channel is on 127.0.0.1 then)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("SPARKDIST_PROGRESS", "0")
    try:
        import cryptography.x509  # noqa: F401 - what the job's TLS certificate needs
    except ImportError:
        env["SPARKDIST_TLS"] = "0"
    return env


def run_way(run: Run, work: Path) -> dict:
    """Run one way in a process of its own; its figures, or its `error` (the other ways'
    figures are still worth having: a GPU machine is lent for minutes)."""
    result = work / f"result-{run.way}.json"
    argv = [sys.executable, __file__, "--child", json.dumps(asdict(run)), "--result", str(result)]
    began = time.perf_counter()
    done = subprocess.run(argv, env=child_environment(), capture_output=True, text=True)
    took = time.perf_counter() - began
    if done.returncode != 0 or not result.exists():
        tail = (done.stdout + done.stderr)[-3000:]
        return {"way": run.way, "error": f"exited {done.returncode}: {tail}", "process_s": took}
    return {**json.loads(result.read_text()), "process_s": took}


def child_main(run_json: str, result: Path) -> None:
    warnings.filterwarnings("ignore", message=".*not writable.*")
    run = Run(**json.loads(run_json))
    result.write_text(json.dumps(RUNS[run.way](run)))


def table_rows(found: dict[str, dict], flops: float, peak: float | None) -> list[list]:
    floor = found.get("floor", {}).get("tokens_per_s")
    rows = []
    for way, r in found.items():
        if "error" in r:
            rows.append([f"{WAYS[way]}: failed", *[None] * (len(COLUMNS) - 2), r["process_s"]])
            continue
        rate = r["tokens_per_s"]
        mfu = 100 * rate * flops / (peak * 1e12) if peak else None
        rows.append(
            [
                WAYS[way],
                round(rate),
                f"{rate / floor:.3f}x" if floor else None,
                r["step_ms_median"],
                r["step_ms_p90"],
                mfu,
                r["loader_ms"],
                r["report_ms"],
                r["commit_ms"],
                r["losses"][-1],
                r["process_s"],
            ]
        )
    return rows


COLUMNS = [
    "way",
    "tokens/s",
    "vs floor",
    "step ms",
    "p90 ms",
    "MFU %",
    "loader ms/step",
    "report ms/step",
    "ms/commit",
    "last loss",
    "process s",
]
"""The last: the way's whole process, its start, the model's build and compile included."""


def figure_line(device: str, model: str, found: dict[str, dict], mfu: float | None) -> str:
    """The one line `make gpu-check` shows."""
    parts = []
    floor = found.get("floor", {}).get("tokens_per_s")
    for way, r in found.items():
        if "error" in r:
            parts.append(f"{way} failed")
            continue
        rate = r["tokens_per_s"]
        text = f"{way} {rate:,.0f} tok/s" + (f" ({rate / floor:.2f}x)" if floor else "")
        if r["commit_ms"] is not None:
            text += f", loader {r['loader_ms']:.2f} ms, report {r['report_ms']:.2f} ms"
            text += f", commit {r['commit_ms']:.1f} ms"
        parts.append(text)
    head = f"{device} {model}" + (f", floor MFU {mfu:.1f}%" if mfu is not None else ", MFU n/a")
    return head + ": " + "; ".join(parts)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if any)")
    parser.add_argument("--model", choices=sorted(MODELS), help="default gpt2 (CUDA), tiny")
    parser.add_argument("--seq", type=int, help="sequence length (default: the model's)")
    parser.add_argument("--batch", type=int, help="sequences a step (default 16 CUDA, 8 CPU)")
    parser.add_argument("--steps", type=int, help="timed steps (default 50 CUDA, 8 CPU)")
    parser.add_argument("--warmup", type=int, help="steps not timed (default 5 CUDA, 2 CPU)")
    parser.add_argument(
        "--compile", action=argparse.BooleanOptionalAction, help="torch.compile (default: CUDA)"
    )
    parser.add_argument("--ways", default=",".join(WAYS), help=f"of {', '.join(WAYS)}")
    parser.add_argument("--peak-tflops", type=float, help="the device's dense bf16 peak")
    parser.add_argument("--profile", help="a folder: a Chrome trace of one more step a way")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return args
    cuda = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    args.device = args.device or ("cuda" if cuda else "cpu")
    args.model = args.model or ("gpt2" if cuda else "tiny")
    args.seq = args.seq or MODELS[args.model].seq
    args.batch = args.batch or (16 if cuda else 8)
    args.steps = args.steps or (50 if cuda else 8)
    args.warmup = (5 if cuda else 2) if args.warmup is None else args.warmup
    args.compile = cuda if args.compile is None else args.compile
    args.ways = [way.strip() for way in args.ways.split(",") if way.strip()]
    unknown = [way for way in args.ways if way not in WAYS]
    if unknown or not args.ways:
        parser.error(f"--ways: {unknown or 'none'} (known: {', '.join(WAYS)})")
    if min(args.seq, args.batch, args.steps) < 2 or args.warmup < 0:
        parser.error("--seq, --batch and --steps must be at least 2, --warmup at least 0")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child_main(args.child, Path(args.result))
        return
    import bench_table  # a sibling script (here, not in the rank, which imports this one)

    device = torch.device(args.device)
    shape = Shape(**{**asdict(MODELS[args.model]), "seq": args.seq})
    model = Decoder(shape)
    flops, params = flops_per_token(model, shape), sum(p.numel() for p in model.parameters())
    peak = peak_tflops(device, args.peak_tflops)
    with tempfile.TemporaryDirectory(prefix="sparkdist-gpu-train-") as tmp:
        data = Path(tmp, "data", "part-00000.parquet")
        data.parent.mkdir()
        write_tokens(data, args.batch * (args.warmup + args.steps + 1), args.seq, args.batch)
        found = {}
        profile = str(Path(args.profile).resolve()) if args.profile else None
        for way in args.ways:
            options = {k: getattr(args, k) for k in ("model", "seq", "batch", "warmup", "steps")}
            options.update(compile=args.compile, device=args.device, profile=profile)
            run = Run(way, **options, data=str(data))
            found[way] = run_way(run, Path(tmp))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    title = (
        f"{args.model} ({params / 1e6:.1f}M parameters, {flops / 1e9:.3f} GFLOP/token), "
        f"batch {args.batch} x {args.seq} tokens, on {name} (torch {torch.__version__}), "
        f"compile {'on' if args.compile else 'off'}, {args.steps} steps after {args.warmup}, "
        f"peak {f'{peak:g} TFLOPS' if peak else 'n/a'}"
    )
    rows = table_rows(found, flops, peak)
    bench_table.print_table(f"{device.type}-{args.model}", title, COLUMNS, rows)
    floor_mfu = rows[0][5] if args.ways[0] == "floor" else None
    figure = figure_line(device.type, args.model, found, floor_mfu)
    line = {"figure": figure, "ways": found, "flops_per_token": flops, "peak_tflops": peak}
    print(json.dumps({**line, "device": name}), flush=True)
    failed = {way: r["error"] for way, r in found.items() if "error" in r}
    for way, error in failed.items():
        print(f"gpu_train: way {way} {error}", file=sys.stderr)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
