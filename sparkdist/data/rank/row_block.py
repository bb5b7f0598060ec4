"""Rows as blocks: a table's narrow columns put in a shuffled order a block at a time, and
feature stacks.

A Spark table usually holds its features as scalar columns, one per feature. A shuffled
window's rows are permuted across the whole window, so every piece handed out holds rows
from anywhere in it. Gathered a piece at a time from the columns as decoded, each piece
read one value from each of thousands of cache lines of every column: the window's columns
(33 MiB at 64 columns) passed from the shared cache to a core's once a piece, 16 times a
window, at 4 ns a value (docs/data.md, "Wide tables"). So the order is applied as a row
group is decoded instead (`RowLayout.fill`): each decoded column, still in the decoding
core's cache, is taken whole into the pieces in the epoch's order (``np.take``: 1.7 ns a
value), and the pieces are handed out as they are.

`RowLayout` puts a piece's scalar columns of one dtype into one 2-D block, a column a row
(``[k, rows]``): each column is a contiguous row of it, handed out as it is.

A feature stack (``features={"x": ["f0", ..., "f63"]}`` on a loader) is a run of its own,
transposed whole into the ``[rows, 64]`` array the model wants as its piece is handed out
(`RowLayout.split`), in the decode worker, not stacked per batch. Read in order, where
nothing is gathered, `stack_features` builds it with one transposing copy a chunk. Array
columns are already rows, and strings are Python objects: both are put in order as they
are.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from sparkdist.data.layout import ColumnInfo

Chunk = dict[str, np.ndarray]

Stacks = tuple[tuple[str, tuple[str, ...]], ...]  # (output name, the columns it stacks)


def fresh(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array in memory from Arrow's pool, never reused by the reader.

    Arrow's pool gives back the pages of freed chunks, where fresh numpy memory took a
    page fault every 4 KiB (docs/data.md).
    """
    size = int(np.prod(shape)) * dtype.itemsize
    if not size:
        return np.empty(shape, dtype)
    return np.frombuffer(pa.allocate_buffer(size), dtype).reshape(shape)


Alloc = Callable[[tuple[int, ...], np.dtype], np.ndarray]  # memory for what is handed out


Place = tuple[slice | np.ndarray, slice | np.ndarray]  # (rows of the block, of the chunk)


def placed(values: np.ndarray, place: Place, into: np.ndarray) -> None:
    """Put ``values[src]`` at rows ``dst`` of ``into`` (``place`` is ``(dst, src)``; ``src``
    a slice where the rows come in order).

    Where ``dst`` is all of ``into`` (a chunk that holds all of a piece's rows: the usual
    window, one row group) and the types match, the rows are taken straight into it with
    ``np.take`` (numpy indexing copies element by element, twice as slow; "raise" would
    copy ``out`` again); otherwise they are taken, then written where they go (a stack's
    column of another type is cast).
    """
    dst, src = place
    if isinstance(src, slice):  # rows in order: a copy
        into[dst] = values[src]
        return
    direct = isinstance(dst, slice) and into.dtype == values.dtype != object
    if direct and into[dst].flags.c_contiguous:
        np.take(values, src, axis=0, out=into[dst], mode="clip")
    else:
        into[dst] = np.take(values, src, axis=0)


def copied(values: np.ndarray, alloc: Alloc = fresh) -> np.ndarray:
    """A copy of ``values`` in ``alloc``'s memory (objects: a plain copy): what is handed
    out is never a view of a buffer the reader reuses."""
    if values.dtype == object:
        return values.copy()
    return _copied(values, alloc(values.shape, values.dtype))


def frozen_features(features: Mapping[str, Sequence[str] | str] | None) -> tuple | None:
    """A loader's ``features`` as (name, columns or pattern) pairs: hashable, picklable."""
    if features is None:
        return None
    if isinstance(features, tuple):  # frozen already
        return features
    if not isinstance(features, Mapping):
        raise TypeError(
            f"features must map a name to the columns it stacks, e.g. "
            f'features={{"x": ["f0", "f1"]}} or {{"x": r"f\\d+"}}; got {features!r}'
        )
    return tuple(
        (name, wanted if isinstance(wanted, str) else tuple(wanted))
        for name, wanted in features.items()
    )


def resolve_stacks(features: tuple | None, columns: Sequence[ColumnInfo]) -> Stacks:
    """A loader's ``features`` (`frozen_features`) as (name, columns) pairs, checked
    against ``columns``.

    A value is a list of column names, or a regular expression that the names to stack
    match whole, taken in the data's column order. The columns must be numbers or
    booleans, one value a row; each is stacked once, and the stack's name is new.
    """
    if not features:
        return ()
    known = {info.name: info for info in columns}
    taken: dict[str, str] = {}
    stacks = []
    for name, wanted in features:
        if isinstance(wanted, str):
            pattern = re.compile(wanted)
            names = [info.name for info in columns if pattern.fullmatch(info.name)]
            if not names:
                raise ValueError(
                    f"features[{name!r}]: the pattern {wanted!r} matches no column (the data "
                    f"has {list(known)})"
                )
        else:
            names = list(wanted)
            if not names:
                raise ValueError(f"features[{name!r}] names no column; give at least one")
        missing = [column for column in names if column not in known]
        if missing:
            raise ValueError(
                f"features[{name!r}]: unknown columns {missing}; the data has {list(known)}"
            )
        not_scalar = [column for column in names if known[column].kind != "scalar"]
        if not_scalar:
            raise ValueError(
                f"features[{name!r}]: only number and boolean columns are stacked, and "
                f"{not_scalar} are {[known[column].kind for column in not_scalar]}; an array "
                "column is already one array, a string column cannot be one"
            )
        for column in names:
            if column in taken or names.count(column) > 1:
                raise ValueError(
                    f"features: column {column!r} is stacked twice "
                    f"({taken.get(column, name)!r} and {name!r}); stack each column once"
                )
            taken[column] = name
        stacks.append((name, tuple(names)))
    left = {info.name for info in columns} - set(taken)
    for name, _ in stacks:
        if name in left:
            raise ValueError(
                f"features: {name!r} is a column of the data that is not stacked; name the "
                f"stack something new, e.g. features={{'{name}_stack': [...]}}"
            )
    return tuple(stacks)


def stacked_columns(columns: Sequence[ColumnInfo], stacks: Stacks) -> list[ColumnInfo]:
    """The columns that come out once ``stacks`` are made: each stack an array column of
    its columns' common type, where its first column was."""
    if not stacks:
        return list(columns)
    known = {info.name: info for info in columns}
    first = {names[0]: (name, names) for name, names in stacks}
    stacked = {column for _, names in stacks for column in names}
    out = []
    for info in columns:
        if info.name in first:
            name, names = first[info.name]
            dtype = np.result_type(*[known[column].dtype for column in names])
            out.append(ColumnInfo(name, "array", dtype.name, length=len(names)))
        elif info.name not in stacked:
            out.append(info)
    return out


def stack_features(
    chunk: Chunk, stacks: Stacks, columns: Sequence[ColumnInfo], alloc: Alloc = fresh
) -> Chunk:
    """``chunk`` with each stack's columns replaced by one ``[rows, k]`` array (in
    ``alloc``'s memory), in the order of ``columns`` (`stacked_columns`): the columns
    copied side by side, then transposed in one copy (numpy's, blocked: 8x faster than
    ``np.stack``, which writes a column at a time across the rows)."""
    if not stacks:
        return chunk
    made = {}
    for name, names in stacks:
        parts = [chunk[column] for column in names]
        dtype = np.result_type(*parts)
        made[name] = _copied(np.array(parts, dtype).T, alloc((len(parts[0]), len(parts)), dtype))
    return {
        info.name: made[info.name] if info.name in made else chunk[info.name] for info in columns
    }


@dataclass(frozen=True)
class Run:
    """Scalar columns of one dtype, held together as a block, a column a row
    (``[k, rows]``); a stack (``stack``, its name) comes out as one ``[rows, k]`` array,
    the others as a column each."""

    columns: tuple[str, ...]
    dtype: np.dtype
    stack: str | None = None

    def shape(self, rows: int) -> tuple[int, int]:
        return (len(self.columns), rows)


Blocks = tuple[np.ndarray, ...]  # a piece's runs, one ``[k, rows]`` block each


@dataclass(frozen=True)
class RowLayout:
    """How a shuffled read's scalar columns are held: a ``[k, rows]`` block a run.

    ``runs`` hold the scalar columns, grouped by dtype (a stack is a run of its own);
    ``apart`` are the columns put in order on their own (arrays, strings); ``order`` is
    the order the columns come out in.
    """

    runs: tuple[Run, ...]
    apart: tuple[str, ...]
    order: tuple[str, ...]

    @classmethod
    def of(cls, columns: Sequence[ColumnInfo], stacks: Stacks = ()) -> RowLayout:
        known = {info.name: info for info in columns}
        stacked = {column for _, names in stacks for column in names}
        runs = [
            Run(names, np.result_type(*[known[column].dtype for column in names]), name)
            for name, names in stacks
        ]
        by_dtype: dict[np.dtype, list[str]] = {}
        apart = []
        for info in columns:
            if info.name in stacked:
                continue
            if info.kind == "scalar" and np.dtype(info.dtype) != object:
                by_dtype.setdefault(np.dtype(info.dtype), []).append(info.name)
            else:
                apart.append(info.name)
        runs += [Run(tuple(names), dtype) for dtype, names in by_dtype.items()]
        order = tuple(info.name for info in stacked_columns(columns, stacks))
        return cls(tuple(runs), tuple(apart), order)

    @property
    def decode_order(self) -> tuple[str, ...]:
        """The columns, run after run, then the others: decoded in this order, a group of
        them at a time, each group fills a stretch of each run."""
        return tuple(column for run in self.runs for column in run.columns) + self.apart

    def fill(self, targets: Sequence[tuple[Blocks, Place]], chunk: Chunk) -> None:
        """Put ``chunk``'s scalar columns (all, or a stretch of `decode_order`) into each
        target's blocks at its place (`placed`), a column taken into every target in turn
        (so that it stays in this core's cache meanwhile: twice as fast as a target at a
        time, all columns)."""
        for index, run in enumerate(self.runs):
            for j, column in enumerate(run.columns):
                if column in chunk:
                    for blocks, place in targets:
                        placed(chunk[column], place, blocks[index][j])

    def split(self, blocks: Blocks, apart: Chunk, alloc: Alloc | None = None) -> Chunk:
        """Blocks back as columns (each a contiguous row of its run's block; a stack
        transposed whole into ``[rows, k]``: one copy a piece, numpy's blocked transpose),
        with the ``apart`` ones, in order. With ``alloc`` (a device feed's slot) every
        array but the objects is copied into it; a stack's transpose always goes there
        (``alloc`` or fresh memory)."""
        out = dict(apart)
        if alloc is not None:
            out = {name: copied(values, alloc) for name, values in apart.items()}
        for run, block in zip(self.runs, blocks, strict=True):
            if run.stack is not None:
                rows, k = block.shape[1], block.shape[0]
                out[run.stack] = _copied(block.T, (alloc or fresh)((rows, k), run.dtype))
            else:
                columns = block if alloc is None else copied(block, alloc)
                out.update(zip(run.columns, columns, strict=True))
        return {name: out[name] for name in self.order}


def _copied(values: np.ndarray, into: np.ndarray) -> np.ndarray:
    np.copyto(into, values)
    return into
