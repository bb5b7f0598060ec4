"""Copying state: to memory at a commit, and from world rank 0 to every rank at a sync.

A `state_dict` is a tree of dicts, lists and tuples whose leaves are tensors or plain
values. World rank 0 sends the tree's shape with the plain values once
(`broadcast_object_list`), then the tensors, one flat buffer per dtype, sent as bytes
(`dist.broadcast`):
a rank that joins with no optimizer state yet gets it all, and a large model costs a few
collectives, not one per parameter.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class _TensorSlot:
    """Where a tensor of the tree sits in its dtype's flat buffer."""

    dtype: Any
    shape: tuple[int, ...]
    offset: int


def map_leaves(tree: Any, leaf: Callable[[Any], Any]) -> Any:
    """`tree` with `leaf(value)` in place of each value that is not a dict, list or tuple."""
    if isinstance(tree, dict):
        return type(tree)((key, map_leaves(value, leaf)) for key, value in tree.items())
    if type(tree) in (list, tuple):
        return type(tree)(map_leaves(value, leaf) for value in tree)
    return leaf(tree)


def _leaves(tree: Any) -> list[Any]:
    """The values of `tree` that are not dicts, lists or tuples, in `map_leaves`' order."""
    found: list[Any] = []
    map_leaves(tree, found.append)
    return found


def _tensor_layout(tree: Any) -> list[tuple[Any, tuple[int, ...]]] | None:
    """Each tensor leaf's dtype and shape, in order (None for no tree)."""
    import torch

    if tree is None:
        return None
    return [(v.dtype, tuple(v.shape)) for v in _leaves(tree) if isinstance(v, torch.Tensor)]


def snapshot(tree: Any, into: Any = None, copies: Any = None) -> Any:
    """A deep copy of `tree`; tensors cloned to CPU memory (`detach().to("cpu", copy=True)`).

    `into`: an earlier snapshot. When its tensors have the same dtypes and shapes, in the
    same order, they are overwritten instead of new ones allocated: a commit every step
    then holds one copy of the model, not two while the next is taken, and allocates
    nothing. `copies`: a `host_copies.DeviceCommits`; the device (CUDA) tensors it takes
    are copied by it, into pinned buffers on a side stream: wait on it before reading
    them."""
    import torch
    from torch.distributed.tensor import DTensor

    reuse = None
    if into is not None and _tensor_layout(into) == _tensor_layout(tree):
        reuse = iter([v for v in _leaves(into) if isinstance(v, torch.Tensor)])
    if copies is not None:
        copies.begin()

    def copied(value: Any) -> Any:
        if isinstance(value, DTensor):
            raise TypeError(
                "elastic.TorchState holds whole tensors, not shards (DTensor: FSDP2, tensor "
                "parallel): a sharded state resumes by relaunch from "
                "checkpoint.save(..., sharded=True)"
            )
        if isinstance(value, torch.Tensor):
            host = next(reuse) if reuse is not None else None
            if copies is not None and copies.takes(value):
                return copies.add(value, host)
            if copies is not None:
                copies.skip()
            if host is not None:
                return host.copy_(value.detach())
            return value.detach().to("cpu", copy=True)
        return copy.deepcopy(value)

    copied_tree = map_leaves(tree, copied)
    if copies is not None:
        copies.launch()
    return copied_tree


def _split(tree: Any, buffers: dict) -> Any:
    """`tree` with each tensor replaced by its slot; the tensors appended to `buffers[dtype]`."""
    import torch

    def slot(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        parts = buffers.setdefault(value.dtype, [])
        offset = sum(part.numel() for part in parts)
        parts.append(value.detach().reshape(-1))
        return _TensorSlot(value.dtype, tuple(value.shape), offset)

    return map_leaves(tree, slot)


def _join(tree: Any, flat: dict) -> Any:
    """`tree` with each slot replaced by its tensor, taken from `flat[dtype]`."""

    def tensor(value: Any) -> Any:
        if not isinstance(value, _TensorSlot):
            return value
        count = math.prod(value.shape)
        return flat[value.dtype][value.offset : value.offset + count].reshape(value.shape).clone()

    return map_leaves(tree, tensor)


def broadcast_object(value: Any, rank: int) -> Any:
    """World rank 0's `value`, on every rank."""
    import torch.distributed as dist

    box = [value if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def broadcast_tree(tree: Any, rank: int, device) -> Any:
    """World rank 0's `tree` (a state_dict), on every rank; tensors on CPU except the
    root's own, which it keeps."""
    import torch
    import torch.distributed as dist

    buffers: dict = {}
    shape = _split(tree, buffers) if rank == 0 else None
    sizes = {dtype: sum(p.numel() for p in parts) for dtype, parts in buffers.items()}
    shape, sizes = broadcast_object((shape, sizes), rank)
    flat = {}
    for dtype in sorted(sizes, key=str):  # the same order on every rank
        if rank == 0:
            buffer = torch.cat([part.to(device) for part in buffers[dtype]])
        else:  # pinned when received in host memory for a GPU: copied on without a stall
            pin = torch.device(device).type == "cpu" and torch.cuda.is_available()
            buffer = torch.empty(sizes[dtype], dtype=dtype, device=device, pin_memory=pin)
        if sizes[dtype]:
            dist.broadcast(buffer.view(torch.uint8), src=0)  # as bytes: any dtype, any backend
        flat[dtype] = buffer.cpu()
    return tree if rank == 0 else _join(shape, flat)
