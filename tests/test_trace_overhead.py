"""benchmarks/trace_overhead.py (issue 63) runs, tiny: its three tables printed and kept as
JSON (benchmarks/bench_table.py), with the rows each table promises. No timings are
asserted: the figures are the benchmark's to show, not the tests' to judge."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_table  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "trace_overhead.py"
KINDS = ["np=-2, steps", "np=-2, batches + steps"]
MEASURES = [
    "rank 0 µs/step",
    "slowest rank µs/step",
    "rank 0 CPU µs/step",
    "job wall s",
    "driver CPU s",
]


def test_the_benchmark_prints_and_writes_its_tables_at_tiny_settings(tmp_path):
    command = [sys.executable, str(SCRIPT), "--steps", "50", "--rounds", "1"]
    command += ["--size-steps", "100", "--timeit-number", "500"]
    env = {**os.environ, bench_table.OUT_ENV: str(tmp_path)}
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    tables = bench_table.read_tables(tmp_path / "trace_overhead.json")
    assert list(tables) == ["steps", "size", "hooks"]

    steps = tables["steps"]
    assert steps["columns"] == [
        "job",
        "measure",
        "trace on",
        "on min-max",
        "trace off",
        "off min-max",
        "on/off",
    ]
    assert [row[:2] for row in steps["rows"]] == [[k, m] for k in KINDS for m in MEASURES]
    for row in steps["rows"]:
        on, off, ratio = row[2], row[4], row[6]
        assert all(isinstance(v, int | float) and v >= 0 for v in (on, off, ratio)), row
        assert re.fullmatch(r"[\d.,]+-[\d.,]+", row[3]) and re.fullmatch(r"[\d.,]+-[\d.,]+", row[5])

    size = tables["size"]
    assert [row[:3] for row in size["rows"]] == [
        [KINDS[0], 50, 2],
        [KINDS[1], 50, 2],
        [f"{KINDS[0]}, one long job", 100, 2],
    ]
    assert all(row[3] > 0 and row[4] > 0 for row in size["rows"])

    hooks = tables["hooks"]
    assert hooks["columns"] == ["call", "recording", "recorded", "ns median", "ns min"]
    calls = [(row[0].split(",")[0].split("(")[0], row[1]) for row in hooks["rows"]]
    for hook in ("rank_trace.step", "rank_trace.data_wait"):
        assert (hook, "on") in calls and (hook, "off") in calls
    assert ("JobTrace.rank_events", "driver") in calls
    assert all(row[3] > 0 and row[4] > 0 for row in hooks["rows"])
    # recorded only with recording on, and a short wait never
    recorded = {(row[0], row[1]): row[2] for row in hooks["rows"]}
    assert recorded["rank_trace.step('report', n)", "on"] == "yes"
    assert recorded["rank_trace.step('report', n)", "off"] == "no"
    assert recorded["rank_trace.data_wait(t0, t1), 50 µs wait", "on"] == "no"

    printed = done.stdout
    for table in tables.values():
        assert table["title"] in printed
    assert re.search(r"load average \(1, 5, 15 min\): [\d.]+ [\d.]+ [\d.]+", printed)
