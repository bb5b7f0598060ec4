"""One way for every benchmark to print a table and keep its rows as JSON beside it.

`print_table` prints the table as the benchmark lays it out (or, given no text, in plain
aligned columns) and writes `<out dir>/<benchmark>.json`: the run's command and every table
the benchmark printed so far, each with its key, title, columns and rows. `benchmarks/
figures.py` draws the docs' figures from those files. The out dir is `$SPARKDIST_BENCH_OUT`,
by default `build/bench/` of this checkout; `<benchmark>` is the running script's name.

    {"benchmark": "scale", "command": "benchmarks/scale.py --repeat 3",
     "tables": [{"key": "simulator", "title": "...", "columns": ["ranks", ...],
                 "rows": [[16, 2, 0.05, ...], ...]}]}

Cells are kept as numbers where they are numbers (a string such as "3,481,056" or "1.07x"
too); "-", "n/a", "" and NaN become null; anything else stays a string.

Not a benchmark itself: `make bench` leaves it out of the scripts it runs.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

OUT_ENV = "SPARKDIST_BENCH_OUT"
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "build" / "bench"
MISSING = ("", "-", "n/a")
DIGITS = 6
"""Significant digits a float keeps (timings are not more precise than that), or its
integer digits where it has more."""
_NUMBER = re.compile(r"[-+]?(\d[\d,]*)?\.?\d+(e[-+]?\d+)?x?")

_written: dict[Path, dict] = {}
"""What this process wrote to each file: a benchmark's later tables join its earlier ones,
and a file left by an earlier run is replaced at the first table."""


def out_dir() -> Path:
    return Path(os.environ.get(OUT_ENV) or DEFAULT_OUT)


def benchmark_name() -> str:
    """The running script's name: `python benchmarks/scale.py` writes `scale.json`."""
    return Path(sys.argv[0]).stem or "benchmark"


def number(cell: object) -> object:
    """`cell` as JSON keeps it: a number where it reads as one, null where it is missing."""
    if isinstance(cell, bool) or cell is None:
        return cell
    if isinstance(cell, int):
        return cell
    if isinstance(cell, float):
        return _rounded(cell) if math.isfinite(cell) else None
    text = str(cell).strip()
    if text in MISSING:
        return None
    if not _NUMBER.fullmatch(text):
        return text
    value = float(text.removesuffix("x").replace(",", ""))
    return int(value) if value.is_integer() and not re.search(r"[.ex]", text) else value


def _rounded(value: float) -> float:
    """`value` to DIGITS significant digits, but never fewer than its integer digits."""
    if value == 0:
        return 0.0
    return round(value, max(0, DIGITS - 1 - math.floor(math.log10(abs(value)))))


def format_table(title: str, columns: Sequence[str], rows: Sequence[Sequence]) -> str:
    """A plain layout: the title, then left-aligned text and right-aligned numbers (floats
    as the JSON keeps them)."""
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [
        max(len(str(c)) for c in [name, *(r[i] for r in cells)]) for i, name in enumerate(columns)
    ]
    numeric = [
        all(isinstance(row[i], int | float) or row[i] is None for row in rows)
        for i in range(len(columns))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if right else v.ljust(w)
            for v, w, right in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([title, line(list(columns)), *(line(row) for row in cells)])


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{_rounded(value):,}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def print_table(
    key: str,
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence],
    text: str | None = None,
    name: str | None = None,
) -> Path:
    """Print `text` (the table as the benchmark lays it out; `format_table` when None) and
    write the rows as JSON; returns the file written. `key` names the table for readers of
    the file (titles change with a run's options)."""
    print(format_table(title, columns, rows) if text is None else text, flush=True)
    return write_table(key, title, columns, rows, name)


def write_table(
    key: str,
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence],
    name: str | None = None,
) -> Path:
    """Add one table to this benchmark's JSON file (see the module's docstring)."""
    for row in rows:
        if len(row) != len(columns):
            raise ValueError(f"{key}: a row of {len(row)} cells for {len(columns)} columns")
    name = name or benchmark_name()
    path = out_dir() / f"{name}.json"
    document = _written.setdefault(
        path, {"benchmark": name, "command": " ".join(sys.argv), "tables": []}
    )
    document["tables"] = [t for t in document["tables"] if t["key"] != key]
    document["tables"].append(
        {
            "key": key,
            "title": title.strip(),
            "columns": list(columns),
            "rows": [[number(cell) for cell in row] for row in rows],
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(document))
    return path


def dumps(document: dict) -> str:
    """The file's text: indented, but each of a table's fields (its columns: a list) and
    each row on one line; a table's fields other than the four (a transcribed table's
    "source") are kept."""
    tables = []
    for table in document["tables"]:
        rows = "".join(f"\n    {json.dumps(row)}," for row in table["rows"])[:-1]
        fields = "".join(
            f"   {json.dumps(key)}: {json.dumps(value)},\n"
            for key, value in table.items()
            if key != "rows"
        )
        tables.append("  {\n" + fields + f'   "rows": [{rows}\n   ]\n' + "  }")
    head = {key: document[key] for key in ("benchmark", "command")}
    fields = [f" {json.dumps(key)}: {json.dumps(value)}," for key, value in head.items()]
    body = ",\n".join(tables)
    return "{\n" + "\n".join(fields) + f'\n "tables": [\n{body}\n ]\n}}\n'


def read_tables(path: Path) -> dict[str, dict]:
    """A benchmark's JSON file as {key: table}."""
    return {table["key"]: table for table in json.loads(Path(path).read_text())["tables"]}
