"""What an elastic commit costs: per GB, synchronous against overlapped, and the step time
with and without a commit every step.

    python benchmarks/gpu_commit.py [--device cuda] [--params 100M] [--steps 10]

The model: `--params` parameters in six square Linear layers, trained with Adam, so the
commit (parameters and both Adam moments) is three times the parameters' bytes. Rows:

* step: forward, backward and Adam on a batch of 16, no commit;
* step + commit, synchronous: `elastic.TorchState.commit()` copying every tensor to
  pageable host memory before it returns (what a commit did before, and what it does for
  CPU tensors);
* step + commit, overlapped (CUDA only): the commit as it is now: staged on the device,
  copied to pinned host buffers on a side stream while the next step runs;
* commit alone: how long `commit()` holds the training thread (the stall), and until its
  copies are complete, per GB of committed state.

On a CPU device there is nothing to overlap: the CUDA rows are left out. The last line is
JSON (`{"figure": ...}`) for `make gpu-check`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_table  # noqa: E402 (a sibling script, not a package)

LAYERS = 6


def parse_count(text: str) -> int:
    scale = {"K": 1e3, "M": 1e6, "G": 1e9}.get(text[-1].upper(), 1)
    return int(float(text[:-1] if scale != 1 else text) * scale)


def make_model(params: int, device: str):
    import torch

    width = int(math.sqrt(params / LAYERS))
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(16, width, device=device)
    return model, optimizer, x


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def train_step(model, optimizer, x) -> None:
    optimizer.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    optimizer.step()


def step_time(model, optimizer, x, device: str, steps: int, commit=None) -> float:
    """Seconds per step (with `commit()` after each, if given), the device drained."""
    train_step(model, optimizer, x)  # warm
    if commit is not None:
        commit()
    sync(device)
    began = time.perf_counter()
    for _ in range(steps):
        train_step(model, optimizer, x)
        if commit is not None:
            commit()
    sync(device)
    return (time.perf_counter() - began) / steps


def commit_alone(state, device: str, repeat: int = 3) -> tuple[float, float]:
    """(seconds `commit()` takes to return, seconds until its copies are complete)."""
    stall, whole = float("inf"), float("inf")
    for _ in range(repeat):
        state.wait_commit()
        sync(device)
        began = time.perf_counter()
        state.commit()
        returned = time.perf_counter()
        state.wait_commit()
        sync(device)
        stall = min(stall, returned - began)
        whole = min(whole, time.perf_counter() - began)
    return stall, whole


def synchronous(state) -> None:
    """Make `state` commit as before: every tensor copied to pageable memory, in line."""
    from sparkdist.elastic import host_copies

    class InLine(host_copies.DeviceCommits):
        def takes(self, tensor) -> bool:
            return False

    state._copies = {name: InLine() for name in state._copies}
    state._saved = {}  # the pinned buffers of the first commit are not reused


def state_gb(state) -> float:
    import torch

    total = 0
    for name in ("model", "optimizer"):
        tree = getattr(state, name).state_dict()
        stack = [tree]
        while stack:
            item = stack.pop()
            if isinstance(item, torch.Tensor):
                total += item.numel() * item.element_size()
            elif isinstance(item, dict):
                stack.extend(item.values())
            elif isinstance(item, (list, tuple)):
                stack.extend(item)
    return total / 1e9


def measure(params: int, device: str, steps: int) -> dict:
    from sparkdist import elastic

    model, optimizer, x = make_model(params, device)
    train_step(model, optimizer, x)  # Adam's moments exist: the commit's full size
    rows: dict = {"step": step_time(model, optimizer, x, device, steps)}
    if device == "cuda":
        state = elastic.TorchState(model=model, optimizer=optimizer)
        rows["step + commit, overlapped"] = step_time(
            model, optimizer, x, device, steps, state.commit
        )
        rows["commit overlapped: stall, complete"] = commit_alone(state, device)
    state = elastic.TorchState(model=model, optimizer=optimizer)
    synchronous(state)
    rows["step + commit, synchronous"] = step_time(model, optimizer, x, device, steps, state.commit)
    rows["commit synchronous: stall, complete"] = commit_alone(state, device)
    return {"rows": rows, "gb": state_gb(state)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if any)")
    parser.add_argument("--params", default=None, help="parameters (default 100M; CPU 10M)")
    parser.add_argument("--steps", type=int, default=None, help="steps timed (10 GPU, 3 CPU)")
    args = parser.parse_args()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    params = parse_count(args.params or ("100M" if device == "cuda" else "10M"))
    steps = args.steps or (10 if device == "cuda" else 3)
    found = measure(params, device, steps)
    gb = found["gb"]
    name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    size = f"{params / 1e6:.0f}M parameters, commit {gb:.2f} GB"
    title = f"{size}, on {name} (torch {torch.__version__}), {steps} steps"
    lines = [title, f"{'row':<40} {'ms':>9} {'ms/GB':>9}"]
    figure, cells = [], []
    for row, value in found["rows"].items():
        if isinstance(value, tuple):
            for part, seconds in zip(("stall", "complete"), value, strict=True):
                label = row.split(":")[0] + f" ({part})"
                lines.append(f"{label:<40} {seconds * 1e3:>9.1f} {seconds * 1e3 / gb:>9.1f}")
                figure.append(f"{label} {seconds * 1e3 / gb:.1f} ms/GB")
                cells.append([label, seconds * 1e3, seconds * 1e3 / gb])
        else:
            lines.append(f"{row:<40} {value * 1e3:>9.1f}")
            figure.append(f"{row} {value * 1e3:.1f} ms")
            cells.append([row, value * 1e3, None])
    text = "\n".join(lines)
    bench_table.print_table(device, title, ["row", "ms", "ms/GB"], cells, text=text)
    summary = f"{device}, {params / 1e6:.0f}M params ({gb:.2f} GB): " + "; ".join(figure)
    print(json.dumps({"figure": summary, "rows": found["rows"], "gb": gb}))


if __name__ == "__main__":
    main()
