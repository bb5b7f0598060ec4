"""A batch's tensors packed into one byte buffer, and views of a copy of it back as tensors.

Why: a batch of 66 columns copied to a GPU tensor by tensor is 66 small copies, each a
launch and (from pageable memory) a wait. Packed side by side into one page-locked buffer,
it is one large contiguous copy; on the device the columns come back as views of the
copied bytes, with no copy of their own (docs/gpu.md, "Batches on the device").

Only CPU tensors of the batch are packed; anything else (strings, numbers, tensors of
other devices) stays as it is. A leaf starts at a multiple of `ALIGN` bytes, so that each
view is aligned for its dtype and for the device's vector loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

ALIGN = 256


@dataclass(frozen=True)
class Leaf:
    """Where one tensor of the batch lies in the packed bytes."""

    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def tensors_of(batch: Any) -> list[torch.Tensor]:
    """The CPU tensors of `batch` (a tensor, or a dict, list or tuple of them), in the
    order `rebuild` puts views back."""
    found: list[torch.Tensor] = []
    map_cpu_tensors(batch, found.append)
    return found


def layout(tensors: list[torch.Tensor]) -> tuple[list[Leaf], int]:
    """Each tensor's place in the packed bytes, and the bytes they take in all."""
    leaves, offset = [], 0
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        leaves.append(Leaf(offset, nbytes, tensor.dtype, tuple(tensor.shape)))
        offset += -(-nbytes // ALIGN) * ALIGN
    return leaves, offset


def pack(tensors: list[torch.Tensor], leaves: list[Leaf], into: torch.Tensor) -> None:
    """Copy `tensors` into the byte tensor `into` at their `leaves`' offsets.

    numpy's copy where the dtype has one (a microsecond a column; torch's `copy_` costs a
    few), torch's otherwise (bfloat16).
    """
    host = into.numpy()
    for tensor, leaf in zip(tensors, leaves, strict=True):
        if not leaf.nbytes:
            continue
        piece = host[leaf.offset : leaf.offset + leaf.nbytes]
        try:
            source = tensor.numpy()
        except TypeError:  # no numpy dtype: copy through torch
            view_of(into, leaf).copy_(tensor)
            continue
        np.copyto(piece.view(source.dtype).reshape(source.shape), source, casting="no")


def view_of(packed: torch.Tensor, leaf: Leaf) -> torch.Tensor:
    """The tensor at `leaf` in the byte tensor `packed` (on any device): a view, no copy."""
    piece = packed[leaf.offset : leaf.offset + leaf.nbytes]
    return piece.view(leaf.dtype).view(leaf.shape)


def rebuild(batch: Any, packed: torch.Tensor, leaves: list[Leaf]) -> Any:
    """`batch` with each of its CPU tensors replaced by its view in `packed`."""
    views = iter([view_of(packed, leaf) for leaf in leaves])
    return map_cpu_tensors(batch, lambda tensor: next(views))


def map_cpu_tensors(batch: Any, visit: Any) -> Any:
    """`batch` with `visit` applied to each CPU tensor; other values as they are."""
    if isinstance(batch, torch.Tensor):
        return visit(batch) if batch.device.type == "cpu" else batch
    if isinstance(batch, dict):
        return type(batch)((key, map_cpu_tensors(value, visit)) for key, value in batch.items())
    if type(batch) in (list, tuple):
        return type(batch)(map_cpu_tensors(value, visit) for value in batch)
    return batch
