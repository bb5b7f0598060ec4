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
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class _TensorSlot:
    """Where a tensor of the tree sits in its dtype's flat buffer."""

    dtype: Any
    shape: tuple[int, ...]
    offset: int


def snapshot(tree: Any) -> Any:
    """A deep copy of `tree`; tensors cloned to CPU memory (`detach().to("cpu", copy=True)`)."""
    import torch

    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, dict):
        return type(tree)((key, snapshot(value)) for key, value in tree.items())
    if isinstance(tree, (list, tuple)) and type(tree) in (list, tuple):
        return type(tree)(snapshot(value) for value in tree)
    return copy.deepcopy(tree)


def _split(tree: Any, buffers: dict) -> Any:
    """`tree` with each tensor replaced by its slot; the tensors appended to `buffers[dtype]`."""
    import torch

    if isinstance(tree, torch.Tensor):
        parts = buffers.setdefault(tree.dtype, [])
        offset = sum(part.numel() for part in parts)
        parts.append(tree.detach().reshape(-1))
        return _TensorSlot(tree.dtype, tuple(tree.shape), offset)
    if isinstance(tree, dict):
        return type(tree)((key, _split(value, buffers)) for key, value in tree.items())
    if isinstance(tree, (list, tuple)) and type(tree) in (list, tuple):
        return type(tree)(_split(value, buffers) for value in tree)
    return tree


def _join(tree: Any, flat: dict) -> Any:
    if isinstance(tree, _TensorSlot):
        count = 1
        for size in tree.shape:
            count *= size
        return flat[tree.dtype][tree.offset : tree.offset + count].reshape(tree.shape).clone()
    if isinstance(tree, dict):
        return type(tree)((key, _join(value, flat)) for key, value in tree.items())
    if isinstance(tree, (list, tuple)) and type(tree) in (list, tuple):
        return type(tree)(_join(value, flat) for value in tree)
    return tree


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
        else:
            buffer = torch.empty(sizes[dtype], dtype=dtype, device=device)
        if sizes[dtype]:
            dist.broadcast(buffer.view(torch.uint8), src=0)  # as bytes: any dtype, any backend
        flat[dtype] = buffer.cpu()
    return tree if rank == 0 else _join(shape, flat)
