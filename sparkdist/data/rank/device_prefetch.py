"""Batches already on the device: each copied from pinned host memory on a side stream,
`depth` batches ahead of the one in use, so that the copy overlaps the step.

Why: a training loop that moves each batch with `.to("cuda")` waits for the copy before
every step, and a copy from pageable memory cannot overlap anything. Here batch k+1 is
pinned (if the loader did not already pin it) and its copy queued on a side stream while
batch k is handed out; before batch k+1 is handed out, the compute stream waits for its
copy (on the GPU, not the host), and its tensors are marked as used by the compute stream
so that their memory is not reused while the step still reads them.

On a CPU device the same code runs with `HostSide`, which moves tensors at once: the
order of batches, what is moved and what is not, and the depth are what a CPU test sees.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any


def map_tensors(batch: Any, move: Any) -> Any:
    """`batch` (a tensor, or a dict, list or tuple of them and other values) with `move`
    applied to each tensor; other values as they are (strings stay lists)."""
    import torch

    if isinstance(batch, torch.Tensor):
        return move(batch)
    if isinstance(batch, dict):
        return type(batch)((key, map_tensors(value, move)) for key, value in batch.items())
    if type(batch) in (list, tuple):
        return type(batch)(map_tensors(value, move) for value in batch)
    return batch


class CudaSide:
    """A side stream of `device` for batch copies."""

    def __init__(self, device: Any) -> None:
        import torch

        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device)

    def start(self, batch: Any) -> tuple[Any, Any]:
        """Queue `batch`'s copy to the device; (the batch on the device, its event)."""
        import torch

        def move(tensor: Any) -> Any:
            pinned = tensor if tensor.is_pinned() else tensor.pin_memory()
            return pinned.to(self.device, non_blocking=True)

        with torch.cuda.stream(self.stream):
            moved = map_tensors(batch, move)
            done = torch.cuda.Event()
            done.record(self.stream)
        return moved, done

    def finish(self, moved: Any, done: Any) -> Any:
        """Make the compute stream wait for the copy; the batch, safe to use on it."""
        import torch

        current = torch.cuda.current_stream(self.device)
        current.wait_event(done)
        map_tensors(moved, lambda tensor: tensor.record_stream(current))
        return moved


class HostSide:
    """The same steps for a CPU device: tensors moved at once, nothing to wait for."""

    def __init__(self, device: Any) -> None:
        import torch

        self.device = torch.device(device)

    def start(self, batch: Any) -> tuple[Any, Any]:
        return map_tensors(batch, lambda tensor: tensor.to(self.device)), None

    def finish(self, moved: Any, done: Any) -> Any:
        return moved


def side_for(device: Any) -> CudaSide | HostSide:
    import torch

    kind = torch.device(device).type
    if kind == "cuda":
        return CudaSide(device)
    if kind == "cpu":
        return HostSide(device)
    raise ValueError(f"device={device!r}: batches can be prefetched to cuda or cpu")


class DevicePrefetcher:
    """Iterates `batches` on `device`, each copied `depth` (>= 1) batches ahead of use.

    ```python
    for batch in DevicePrefetcher(loader, "cuda"):  # or make_torch_dataloader(device=...)
        loss = model(batch["x"])  # already on the GPU; the next batch is on its way
    ```
    """

    def __init__(self, batches: Iterable[Any], device: Any, depth: int = 1) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be an int >= 1 (batches copied ahead), got {depth!r}")
        self.batches, self.depth = batches, depth
        self.side = side_for(device)

    def __iter__(self) -> Iterator[Any]:
        source = iter(self.batches)
        ahead: deque = deque()
        for batch in source:  # the first `depth` batches on their way
            ahead.append(self.side.start(batch))
            if len(ahead) == self.depth:
                break
        while ahead:
            moved, done = ahead.popleft()
            following = next(source, _END)
            if following is not _END:  # queued before this one is handed out: overlapped
                ahead.append(self.side.start(following))
            yield self.side.finish(moved, done)

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]


_END = object()
