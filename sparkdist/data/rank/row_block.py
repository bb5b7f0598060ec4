"""Rows as blocks: a table's narrow columns side by side in one buffer, and feature stacks.

A Spark table usually holds its features as scalar columns, one per feature. Shuffled
column by column, every column is a gather of its own: 66 columns are 66 random walks
through memory, and 66 Python calls a piece. `RowLayout` lays the scalar columns of a
window side by side, row after row, in one byte matrix, so that a shuffled piece is one
``np.take`` of whole rows for all of them; the rows come back out as columns with one
transposing copy per run of columns of one dtype, not one call per column
(docs/data.md, "Wide tables").

A feature stack (``features={"x": ["f0", ..., "f63"]}`` on a loader) is such a run too:
its columns are laid out next to each other, so the gathered rows already hold the
``[rows, 64]`` array the model wants; it is copied out once, in the decode worker, not
stacked per batch. Read in order, where nothing is gathered, `stack_features` builds it
with one ``np.stack`` a chunk. Array columns are already rows, and strings are Python
objects: both are gathered as they are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from sparkdist.data.layout import ColumnInfo

Chunk = dict[str, np.ndarray]

# Bytes of a window's rows filled at once (`RowLayout.fill`): about a core's cache.
TILE_BYTES = 2 << 20
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


def gather(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``values[rows]``, whole rows at a time, into `fresh` memory (it is handed out).

    ``np.take`` copies whole rows (numpy indexing copies element by element, twice as
    slow).
    """
    if values.dtype == object:
        return np.take(values, rows, axis=0)
    out = fresh((len(rows), *values.shape[1:]), values.dtype)
    return np.take(values, rows, axis=0, out=out, mode="clip")  # "raise" copies ``out`` again


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


def stack_features(chunk: Chunk, stacks: Stacks, columns: Sequence[ColumnInfo]) -> Chunk:
    """``chunk`` with each stack's columns replaced by one ``[rows, k]`` array, in the
    order of ``columns`` (`stacked_columns`): the columns copied side by side, then
    transposed in one copy (numpy's, blocked: 8x faster than ``np.stack``, which writes
    a column at a time across the rows)."""
    if not stacks:
        return chunk
    made = {}
    for name, names in stacks:
        parts = [chunk[column] for column in names]
        dtype = np.result_type(*parts)
        made[name] = _copied(np.array(parts, dtype).T, fresh((len(parts[0]), len(parts)), dtype))
    return {
        info.name: made[info.name] if info.name in made else chunk[info.name] for info in columns
    }


@dataclass(frozen=True)
class Run:
    """Scalar columns of one dtype, side by side at ``offset`` bytes into each row; a
    stack (``stack``, its name) comes out as one array, the others as a column each."""

    columns: tuple[str, ...]
    dtype: np.dtype
    offset: int
    stack: str | None = None


@dataclass(frozen=True)
class RowLayout:
    """Where each scalar column (and each stack) sits in a row of a window's byte matrix.

    ``runs`` hold the scalar columns, grouped by dtype, widest first, so that every value
    is aligned; ``apart`` are the columns gathered on their own (arrays, strings);
    ``order`` is the order the columns come out in.
    """

    runs: tuple[Run, ...]
    row_bytes: int
    apart: tuple[str, ...]
    order: tuple[str, ...]

    @classmethod
    def of(cls, columns: Sequence[ColumnInfo], stacks: Stacks = ()) -> RowLayout:
        known = {info.name: info for info in columns}
        stacked = {column for _, names in stacks for column in names}
        groups: list[tuple[np.dtype, tuple[str, ...], str | None]] = [
            (np.result_type(*[known[column].dtype for column in names]), names, name)
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
        groups += [(dtype, tuple(names), None) for dtype, names in by_dtype.items()]
        groups.sort(key=lambda group: -group[0].itemsize)  # aligned: widest values first
        runs, offset = [], 0
        for dtype, names, stack in groups:
            runs.append(Run(names, dtype, offset, stack))
            offset += len(names) * dtype.itemsize
        widest = max((run.dtype.itemsize for run in runs), default=1)
        row_bytes = -(-offset // widest) * widest
        order = tuple(info.name for info in stacked_columns(columns, stacks))
        return cls(tuple(runs), row_bytes, tuple(apart), order)

    @property
    def decode_order(self) -> tuple[str, ...]:
        """The columns, run after run, then the others: decoded in this order, a group of
        them at a time, each group fills a stretch of each run."""
        return tuple(column for run in self.runs for column in run.columns) + self.apart

    def view(
        self, matrix: np.ndarray, run: Run, first: int = 0, last: int | None = None
    ) -> np.ndarray:
        """``run``'s columns ``first:last`` (default: all) in ``matrix`` (rows of bytes),
        as a ``[rows, columns]`` view."""
        last, size = len(run.columns) if last is None else last, run.dtype.itemsize
        return matrix[:, run.offset + first * size : run.offset + last * size].view(run.dtype)

    def fill(self, matrix: np.ndarray, chunk: Chunk) -> None:
        """Write ``chunk``'s scalar columns (all, or a stretch of `decode_order`) into
        ``matrix``'s rows: a run's columns are transposed into place a tile of rows at a
        time (about 2 MiB of them, in the cache while written; a column at a time across
        the rows is 2-4x slower)."""
        tile = max(TILE_BYTES // max(self.row_bytes, 1), 1)
        for run in self.runs:
            have = [j for j, column in enumerate(run.columns) if column in chunk]
            if not have:
                continue
            first, last = have[0], have[-1] + 1
            columns = [chunk[column] for column in run.columns[first:last]]
            view = self.view(matrix, run, first, last)
            for start in range(0, len(view), tile):
                stop = start + tile
                view[start:stop] = np.array([values[start:stop] for values in columns]).T

    def split(self, matrix: np.ndarray, apart: Chunk) -> Chunk:
        """Gathered rows (``matrix``) back as columns, with the ``apart`` ones, in order.

        A run's columns come out of one transposing copy (each column a contiguous row of
        it); a stack is copied out whole, ``[rows, k]``.
        """
        rows, out = len(matrix), dict(apart)
        for run in self.runs:
            values = self.view(matrix, run)
            if run.stack is not None:
                out[run.stack] = _copied(values, fresh(values.shape, run.dtype))
                continue
            columns = _copied(values.T, fresh((len(run.columns), rows), run.dtype))
            out.update(zip(run.columns, columns, strict=True))
        return {name: out[name] for name in self.order}


def _copied(values: np.ndarray, into: np.ndarray) -> np.ndarray:
    np.copyto(into, values)
    return into
