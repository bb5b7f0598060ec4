"""The simulated scale curve: one simulated job per world size, 8 ranks per simulated
host, and the table of what each cost the driver (`benchmarks/scale.py` prints it
beside the real-process rows; `python -m sparkdist.runner.simulator` prints it alone).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TextIO

from sparkdist.runner.simulator.hosts import LinePlan
from sparkdist.runner.simulator.simulation import Measurement, measure

CURVE_RANKS = (16, 64, 256, 1024)
RANKS_PER_HOST = 8
PAYLOADS = (1 << 20, 100 << 20)
PAYLOAD_BUDGET = 4 << 30
"""A payload is measured only while the bytes it takes to give it to every rank stay
under this (100 MB to 1,024 ranks, one copy each, is 100 GB through one Python process)."""
LINES_PER_RANK = 1000
COLUMNS = (
    "ranks",
    "hosts",
    "form s",
    "1 MB payload s",
    "100 MB payload s",
    "1,000 lines/rank s",
    "collect s",
    "driver CPU s",
    "CPU ms per rank",
    "driver RSS MB",
    "driver threads",
    "driver MB sent",
)


def curve(
    ranks: Iterable[int] = CURVE_RANKS,
    ranks_per_host: int = RANKS_PER_HOST,
    payload_budget: int = PAYLOAD_BUDGET,
) -> list[Measurement]:
    """One simulated job per world size in `ranks`, each measured whole."""
    return [
        measure(n, max(1, n // ranks_per_host), PAYLOADS, payload_budget, LinePlan(LINES_PER_RANK))
        for n in ranks
    ]


def row_cells(row: Measurement) -> list[str]:
    """A measurement as the table's cells (`-`: a payload over the budget)."""
    payloads = [row.payload_s.get(size) for size in PAYLOADS]
    return [
        str(row.ranks),
        str(row.hosts),
        f"{row.form_s:.2f}",
        *("-" if s is None else f"{s:.2f}" for s in payloads),
        f"{row.lines_s:.2f}",
        f"{row.collect_s:.2f}",
        f"{row.cpu_s:.2f}",
        f"{row.cpu_ms_per_rank:.1f}",
        f"{row.rss_mb:.0f}",
        str(row.threads),
        f"{row.sent_bytes / 1e6:.0f}",
    ]


def print_table(rows: Iterable[Measurement], out: TextIO | None = None) -> None:
    """The curve as a Markdown table, then the driver's CPU by phase (the payloads'
    jobs apart from the job that forms, streams and finishes)."""
    out = out or sys.stdout
    rows = list(rows)
    _table(out, COLUMNS, [row_cells(row) for row in rows])
    out.write("\n")
    phases = ("form", "lines", "collect", "payloads")
    cells = [[str(r.ranks), *(f"{r.phase_cpu_s.get(p, 0.0):.2f}" for p in phases)] for r in rows]
    _table(out, ("ranks", *(f"driver CPU s: {p}" for p in phases)), cells)
    out.flush()


def _table(out: TextIO, header: Iterable[str], rows: list[list[str]]) -> None:
    header = list(header)
    out.write("| " + " | ".join(header) + " |\n")
    out.write("|" + "---:|" * len(header) + "\n")
    for cells in rows:
        out.write("| " + " | ".join(cells) + " |\n")
