"""``TransformSpec``: petastorm's per-batch transform hook, on pandas DataFrames.

As in petastorm, ``func`` gets a batch of rows as a ``pandas.DataFrame`` (array columns
hold one numpy array per row) and returns a DataFrame; ``edit_fields`` declares the
columns it adds or changes as ``(name, numpy_dtype, shape, is_nullable)`` (so the loaders
know their types before reading), ``removed_fields`` drops columns and
``selected_fields`` picks (and orders) the columns that come out. It runs on the ranks,
once per decoded chunk (several batches), in the decode workers when there are any.
It must keep the rows (one out per row in): equal steps across ranks depend on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkdist.data.layout import ColumnInfo

if TYPE_CHECKING:
    import pandas as pd


def _field_parts(field: Any) -> tuple[str, Any, tuple[int, ...]]:
    """(name, dtype, shape) of an edit field: a tuple, or petastorm's UnischemaField."""
    if hasattr(field, "numpy_dtype"):
        return field.name, field.numpy_dtype, tuple(field.shape or ())
    if not isinstance(field, tuple | list) or len(field) < 3:
        raise ValueError(
            f"TransformSpec edit_fields entries are (name, numpy_dtype, shape, is_nullable) "
            f"tuples, got {field!r}"
        )
    return field[0], field[1], tuple(field[2] or ())


@dataclass(frozen=True)
class TransformSpec:
    """How to transform each batch on the ranks (petastorm's ``TransformSpec``)."""

    func: Callable[[pd.DataFrame], pd.DataFrame] | None = None
    edit_fields: Sequence[Any] | None = None
    removed_fields: Sequence[str] | None = None
    selected_fields: Sequence[str] | None = None

    @classmethod
    def of(cls, spec: Any) -> TransformSpec | None:
        """``spec`` as a `TransformSpec`, also from petastorm's class of the same shape."""
        if spec is None or isinstance(spec, TransformSpec):
            return spec
        if all(hasattr(spec, name) for name in ("func", "edit_fields", "selected_fields")):
            return cls(
                spec.func,
                spec.edit_fields,
                getattr(spec, "removed_fields", None),
                spec.selected_fields,
            )
        raise TypeError(f"transform_spec must be a sparkdist.data.TransformSpec, got {spec!r}")

    def input_columns(self, columns: Sequence[str], known: dict[str, ColumnInfo]) -> list[str]:
        """The stored columns to read: all asked for (``func`` may use any of them)."""
        return [name for name in columns if name in known]

    def output_columns(self, columns: Sequence[ColumnInfo]) -> list[ColumnInfo]:
        """What comes out of the transform, with types (from ``edit_fields``)."""

        out = {info.name: info for info in columns}
        for name in self.removed_fields or ():
            out.pop(name, None)
        for field in self.edit_fields or ():
            name, dtype, shape = _field_parts(field)
            dtype = np.dtype(dtype)
            if dtype.kind in "US":
                out[name] = ColumnInfo(name, "string", "object")
            elif dtype.kind == "O":
                out[name] = ColumnInfo(name, "binary", "object")
            elif not shape:
                out[name] = ColumnInfo(name, "scalar", dtype.name)
            else:
                length = shape[0] if len(shape) == 1 else None
                out[name] = ColumnInfo(name, "array", dtype.name, length, shape)
        if self.selected_fields is None:
            return list(out.values())
        unknown = [name for name in self.selected_fields if name not in out]
        if unknown:
            raise ValueError(
                f"TransformSpec selected_fields {unknown} are neither stored columns nor "
                f"declared in edit_fields; the known columns are {sorted(out)}"
            )
        return [out[name] for name in self.selected_fields]

    def apply(
        self, chunk: dict[str, np.ndarray], columns: Sequence[ColumnInfo], writable: bool
    ) -> dict[str, np.ndarray]:
        """Run ``func`` on a decoded chunk; numpy arrays of ``columns`` come out."""
        import pandas as pd

        rows = len(next(iter(chunk.values())))
        frame = pd.DataFrame(
            {name: list(values) if values.ndim > 1 else values for name, values in chunk.items()}
        )
        result = self.func(frame) if self.func is not None else frame
        if not isinstance(result, pd.DataFrame):
            raise TypeError(
                f"TransformSpec.func must return a pandas DataFrame, got {type(result).__name__}"
            )
        if len(result) != rows:
            raise ValueError(
                f"TransformSpec.func returned {len(result)} rows for {rows}: it must keep "
                "every row (filter rows in Spark, before make_spark_converter), so that all "
                "ranks take the same number of steps"
            )
        declared = {_field_parts(field)[0] for field in self.edit_fields or ()}
        out = {}
        for info in columns:
            if info.name not in result.columns:
                raise ValueError(
                    f"TransformSpec.func's output has no column {info.name!r} (it has "
                    f"{list(result.columns)}); return it, or drop it with removed_fields"
                )
            values = result[info.name].to_numpy()
            if info.kind in ("string", "binary"):
                out[info.name] = values
                continue
            if values.dtype == object:
                values = np.stack(values) if rows else np.empty((0, *(info.shape or ())))
            if info.name in declared or np.can_cast(values.dtype, info.dtype, "same_kind"):
                values = values.astype(info.dtype, copy=False)
            # else: a column changed in kind (ints scaled to floats) and not declared in
            # edit_fields keeps what func made, as petastorm's torch loader does, rather
            # than being cast back (tf, which needs types up front, wants it declared).
            out[info.name] = np.require(values, requirements=["W", "C"]) if writable else values
        return out
