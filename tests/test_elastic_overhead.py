"""benchmarks/elastic_overhead.py (issue 64's fault-free overhead) runs, tiny: its table
printed and kept as JSON (benchmarks/bench_table.py), a row per way, each against plain.
No timings are asserted: the figures are the benchmark's to show, not the tests' to judge."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_table  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "elastic_overhead.py"
WAYS = [
    "plain",
    "elastic, commit every step",
    "elastic, commit every 10 steps",
    "elastic, no commit",
]


def test_the_benchmark_prints_and_writes_its_table_at_tiny_settings(tmp_path):
    command = [sys.executable, str(SCRIPT), "--rounds", "1", "--steps", "25"]
    command += ["--warmup", "5", "--hidden", "32", "--batch", "16", "--no-warmup-jobs"]
    env = {**os.environ, bench_table.OUT_ENV: str(tmp_path)}
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "round 1/1" in done.stdout
    table = bench_table.read_tables(tmp_path / "elastic_overhead.json")["elastic_overhead"]
    assert "20 timed steps a job" in table["title"]
    assert [row[0] for row in table["rows"]] == WAYS
    for row in table["rows"]:
        wall, cpu = float(row[1]), float(row[4])
        assert wall > 0 and cpu > 0, row
        assert re.fullmatch(r"[\d.]+-[\d.]+", row[2]) and re.fullmatch(r"[\d.]+-[\d.]+", row[5])
        assert re.fullmatch(r"[+-]\d+\.\d %", row[3]) and re.fullmatch(r"[+-]\d+\.\d %", row[6])
    assert table["rows"][0][3] == "+0.0 %" and table["rows"][0][6] == "+0.0 %"
