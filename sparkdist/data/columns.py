"""How the readers describe a column: its own module, since the reader and a
`TransformSpec` (which says what columns a transform makes) both need it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ColumnInfo:
    """One column as the readers deliver it.

    kind is "scalar" (numbers, bool), "array" (fixed-length numeric arrays, ``length``
    elements), "string" or "binary". dtype is the numpy dtype name of a value or element.
    ``shape`` is a row's shape when a transform makes arrays of more than one dimension.
    """

    name: str
    kind: str
    dtype: str
    length: int | None = None
    shape: tuple[int, ...] | None = None
