"""In-memory copies of a sharded (FSDP2/DTensor) state, and its rebuilding in a new world.

No rank holds a full copy of a sharded state, so a world change cannot just broadcast it
from world rank 0 as `TorchState` does. At each commit a rank instead keeps a *piece*: its
local shard of every DTensor of the model's and optimizer's state dicts, with where each
sits in the full tensor (its global offset), packed into one CPU buffer per dtype; and the
*rest*: the replicated leaves (an optimizer's `step`, its param groups) and the plain
values. With neighbour copies, each rank also sends its piece to the next world rank (over
gloo) and keeps the previous rank's.

In a new world, the pieces of one old commit that together cover every old rank are sent,
one old rank's piece at a time, from a rank that holds it (`dist.broadcast`), and every
rank copies the parts that overlap its new local shards: any old layout into any new one,
with one old shard in flight at a time, never the full state on a rank.

Ranks keep the pieces of their last two commits: a rank lost during a commit's exchange
leaves the survivors with a whole commit one step back.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

KEEP = 2
"""Commits whose pieces a rank keeps (its own and its neighbour's)."""


@dataclass(frozen=True)
class Mark:
    """Which world and commit a piece belongs to."""

    generation: int
    world_size: int
    commit: int


@dataclass(frozen=True)
class Entry:
    """One local shard in a piece: its leaf's path, box in the full tensor, and place in
    its dtype's buffer."""

    path: tuple
    offset: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: Any
    start: int


@dataclass
class Piece:
    """World rank `rank`'s local shards at commit `mark`."""

    mark: Mark
    rank: int
    entries: list[Entry]
    buffers: dict  # dtype -> flat CPU tensor
    copies: Any = None
    """The `host_copies.DeviceCommits` still filling `buffers` from the device, if any."""

    @property
    def sizes(self) -> dict:
        return {dtype: buffer.numel() for dtype, buffer in self.buffers.items()}

    def wait(self) -> None:
        """Block until `buffers` hold the commit (its device copies are complete)."""
        if self.copies is not None:
            self.copies.wait()


@dataclass
class Rest:
    """What every rank holds alike at commit `mark`: the state's replicated leaves (tensors
    copied to CPU) and the plain values."""

    mark: Mark
    leaves: dict  # path -> value
    values: Any


@dataclass
class Held:
    """A rank's kept pieces and rests, newest last."""

    pieces: list[Piece] = field(default_factory=list)
    rests: list[Rest] = field(default_factory=list)

    def keep(self, item: Piece | Rest) -> None:
        """Keep `item`; drop what belongs to commits older than the newest `KEEP`."""
        kept = self.pieces if isinstance(item, Piece) else self.rests
        kept.append(item)
        newest = sorted({k.mark for k in kept}, key=_order)[-KEEP:]
        kept[:] = [k for k in kept if k.mark in newest]

    def offers(self) -> list[tuple[Mark, int, bool]]:
        """(commit, old world rank, whether the rest of that commit is here) for each piece."""
        rests = {rest.mark for rest in self.rests}
        return [(p.mark, p.rank, p.mark in rests) for p in self.pieces]

    def piece(self, mark: Mark, rank: int) -> Piece | None:
        return next((p for p in self.pieces if p.mark == mark and p.rank == rank), None)

    def rest(self, mark: Mark) -> Rest | None:
        return next((r for r in self.rests if r.mark == mark), None)

    def recyclable(self, rank: int) -> dict | None:
        """The buffers of world rank `rank`'s own piece that keeping a newer commit will
        drop (the oldest of `KEEP`), for the next commit to overwrite; None if none."""
        marks = sorted({p.mark for p in self.pieces}, key=_order)
        if len(marks) < KEEP:
            return None
        oldest = self.piece(marks[0], rank)
        return oldest.buffers if oldest is not None else None


def _order(mark: Mark) -> tuple[int, int]:
    return (mark.generation, mark.commit)


def leaves(tree: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """(path, leaf) for every leaf of a tree of dicts and lists (a tuple, such as Adam's
    betas, is one leaf)."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from leaves(value, (*path, key))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            yield from leaves(value, (*path, index))
    else:
        yield path, tree


def _set_leaf(tree: Any, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


def local_box(tensor: Any) -> tuple[tuple[int, ...], Any]:
    """A DTensor's global offset and its local shard."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _, offset = compute_local_shape_and_global_offset(
        tensor.shape, tensor.device_mesh, tensor.placements
    )
    return tuple(offset), tensor.to_local()


def take(
    tree: Any, mark: Mark, rank: int, values: Any, copies: Any = None, into: dict | None = None
) -> tuple[Piece, Rest]:
    """This rank's piece and rest of `tree` (a state dict of DTensors and replicated
    leaves), copied to CPU memory. `copies` (a `host_copies.DeviceCommits`) copies the
    local shards it takes (CUDA ones) into pinned buffers on a side stream, reusing
    `into` (an old piece's buffers) when sizes match: `Piece.wait()` before reading."""
    import torch
    from torch.distributed.tensor import DTensor

    parts: dict = {}
    entries, replicated = [], {}
    for path, leaf in leaves(tree):
        if isinstance(leaf, DTensor):
            offset, local = local_box(leaf)
            dtype_parts = parts.setdefault(local.dtype, [])
            start = sum(p.numel() for p in dtype_parts)
            dtype_parts.append(local.detach().reshape(-1))
            entries.append(Entry(path, offset, tuple(local.shape), local.dtype, start))
        elif isinstance(leaf, torch.Tensor):
            replicated[path] = leaf.detach().to("cpu", copy=True)
        else:
            replicated[path] = copy.deepcopy(leaf)
    flat = [part for dtype_parts in parts.values() for part in dtype_parts]
    if copies is not None and flat and all(copies.takes(part) for part in flat):
        buffers = _copy_on_side(parts, copies, into)
        return Piece(mark, rank, entries, buffers, copies), Rest(mark, replicated, values)
    buffers = {dtype: torch.cat(p).to("cpu") for dtype, p in parts.items()}  # cat copies
    return Piece(mark, rank, entries, buffers), Rest(mark, replicated, values)


def _copy_on_side(parts: dict, copies: Any, into: dict | None) -> dict:
    """One host buffer per dtype (`into`'s when its sizes match), filled from the local
    shards `parts` by `copies`, on its side stream."""
    sizes = {dtype: sum(p.numel() for p in dtype_parts) for dtype, dtype_parts in parts.items()}
    reuse = into is not None and {d: b.numel() for d, b in into.items()} == sizes
    copies.begin()
    buffers = {}
    for dtype, dtype_parts in parts.items():
        buffer = into[dtype] if reuse else copies.host_buffer(dtype_parts[0], sizes[dtype])
        start = 0
        for part in dtype_parts:
            copies.add(part, buffer[start : start + part.numel()])
            start += part.numel()
        buffers[dtype] = buffer
    copies.launch()
    return buffers


def exchange(piece: Piece, previous: tuple[list[Entry], dict], group: Any) -> Piece:
    """Send `piece` to the next world rank and receive the previous rank's (whose layout,
    entries and buffer sizes, is `previous`): each rank then holds its neighbour's shards."""
    import torch
    import torch.distributed as dist

    piece.wait()
    size, rank = piece.mark.world_size, piece.rank
    entries, sizes = previous
    received = {dtype: torch.empty(n, dtype=dtype) for dtype, n in sizes.items()}
    ops = [
        dist.P2POp(dist.isend, piece.buffers[dtype].view(torch.uint8), (rank + 1) % size, group)
        for dtype in sorted(piece.buffers, key=str)
    ]
    ops += [
        dist.P2POp(dist.irecv, received[dtype].view(torch.uint8), (rank - 1) % size, group)
        for dtype in sorted(received, key=str)
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return Piece(piece.mark, (rank - 1) % size, entries, received)


@dataclass(frozen=True)
class Plan:
    """Where a new world gets commit `mark` from: `holders[k]` (a new world rank) sends old
    rank k's piece, `source` the rest."""

    mark: Mark
    holders: tuple[int, ...]
    source: int


def plan(offers: list[list[tuple[Mark, int, bool]]]) -> Plan | None:
    """The newest commit whose pieces the new world's ranks (`offers[r]`: what rank r holds)
    hold for every old rank, with its rest; None if there is none."""
    marks = sorted({mark for held in offers for mark, _, _ in held}, key=_order, reverse=True)
    for mark in marks:
        holders: dict[int, int] = {}
        source = None
        for new_rank, held in enumerate(offers):
            for found, old_rank, has_rest in held:
                if found == mark:
                    holders.setdefault(old_rank, new_rank)
                    if has_rest and source is None:
                        source = new_rank
        if source is not None and sorted(holders) == list(range(mark.world_size)):
            return Plan(mark, tuple(holders[k] for k in range(mark.world_size)), source)
    return None


def rebuild(template: Any, chosen: Plan, held: Held, rank: int, group: Any) -> Any:
    """Fill `template` (this world's state dict: DTensors laid out for it) in place with the
    commit `chosen` names, from the pieces its holders send; returns the plain values."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    targets = {
        path: local_box(leaf) for path, leaf in leaves(template) if isinstance(leaf, DTensor)
    }
    for old_rank, holder in enumerate(chosen.holders):
        mine = held.piece(chosen.mark, old_rank) if rank == holder else None
        if mine is not None:
            mine.wait()
        layout = (mine.entries, mine.sizes) if mine is not None else None
        entries, sizes = _broadcast_from(layout, holder, group)
        buffers = {}
        for dtype in sorted(sizes, key=str):
            buffer = (
                mine.buffers[dtype] if mine is not None else torch.empty(sizes[dtype], dtype=dtype)
            )
            dist.broadcast(buffer.view(torch.uint8), src=holder, group=group)
            buffers[dtype] = buffer
        with torch.no_grad():
            for entry in entries:
                if entry.path in targets:
                    count = 1
                    for n in entry.shape:
                        count *= n
                    shard = buffers[entry.dtype][entry.start : entry.start + count].view(
                        entry.shape
                    )
                    offset, local = targets[entry.path]
                    _copy_overlap(local, offset, shard, entry.offset)
    rest = held.rest(chosen.mark) if rank == chosen.source else None
    box = (rest.leaves, rest.values) if rest is not None else None
    replicated, values = _broadcast_from(box, chosen.source, group)
    for path, value in replicated.items():
        _set_leaf(template, path, value)
    return values


def _broadcast_from(value: Any, src: int, group: Any) -> Any:
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


def _copy_overlap(dst, dst_offset, src, src_offset) -> None:
    """Copy the part of `src` (a box at `src_offset` of the full tensor) that overlaps `dst`
    (a box at `dst_offset`) into `dst`; to a GPU without waiting (`non_blocking`): a kept
    host buffer is overwritten only by a later commit, whose copies wait for this one."""
    into, out = [], []
    for d0, dn, s0, sn in zip(dst_offset, dst.shape, src_offset, src.shape, strict=True):
        low, high = max(d0, s0), min(d0 + dn, s0 + sn)
        if low >= high:
            return
        into.append(slice(low - d0, high - d0))
        out.append(slice(low - s0, high - s0))
    dst[tuple(into)].copy_(src[tuple(out)], non_blocking=True)
