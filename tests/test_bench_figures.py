"""The benchmarks' JSON and the docs' figures (issue 63): a benchmark's JSON holds what its
table shows (benchmarks/bench_table.py); benchmarks/figures.py draws every figure from the
data committed under docs/figures/data, and docs/benchmarks.md shows the committed ones; the
recovery figure draws a job's trace (a synthetic one here, in sparkdist/trace/format.py's
form)."""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_table  # noqa: E402
import figures  # noqa: E402
import launch_overhead  # noqa: E402

from sparkdist.trace import format as trace_format  # noqa: E402

DATA = ROOT / "docs" / "figures" / "data"
OTHER_FIGURES = {"timeline-example": "docs/monitoring.md"}
"""Committed figures that benchmarks/figures.py does not draw, and the page that shows each:
the picture of a real job's trace (`Timeline.svg()`, written by benchmarks/trace_example.py
with the trace the recovery figure draws)."""
GENERATIONS, EVENTS = trace_format.GENERATIONS, trace_format.EVENTS
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def out(tmp_path, monkeypatch):
    """The benchmarks' JSON goes to a temporary directory."""
    monkeypatch.setenv(bench_table.OUT_ENV, str(tmp_path))
    return tmp_path


def test_the_plain_layout_and_the_json_hold_the_same_cells(out, capsys):
    columns = ["launcher", "np", "median s", "vs TD"]
    rows = [
        ["sparkdist direct", 2, 0.6712, "0.07x"],
        ["TorchDistributor", 2, 10.14, "1.00x"],
        ["TorchDistributor", 64, None, "n/a"],
        ["a wide reader", 1, 3_481_056.4, "-"],
    ]
    path = bench_table.print_table("launch", "Launch, 3 runs", columns, rows, name="demo")
    printed = capsys.readouterr().out.splitlines()
    assert path == out / "demo.json"
    table = bench_table.read_tables(path)["launch"]
    assert (table["title"], table["columns"]) == ("Launch, 3 runs", columns)
    assert printed[0] == "Launch, 3 runs"
    assert re.split(r"\s{2,}", printed[1].strip()) == columns
    for line, row in zip(printed[2:], table["rows"], strict=True):
        assert [bench_table.number(c) for c in re.split(r"\s{2,}", line.strip())] == row
    assert table["rows"][0] == ["sparkdist direct", 2, 0.6712, 0.07]
    assert table["rows"][2] == ["TorchDistributor", 64, None, None]
    assert table["rows"][3][2] == 3_481_056.0  # integer digits are never rounded away


def test_a_benchmarks_own_layout_is_printed_as_before_and_its_rows_kept(out, capsys):
    """launch_overhead.py's warm table: the printed row and the JSON's, cell by cell."""
    rows = [
        ("sparkdist warm direct np=2", None, 7.61, 0.0461, 0.039),
        ("Ray on Spark TorchTrainer.fit np=2", 53.71, 36.52, 34.149, 33.197),
    ]
    launch_overhead.print_kept_table(rows, 4, 14.5)
    printed = capsys.readouterr().out.splitlines()
    assert printed[1].startswith("Kept between runs") and printed[2].split()[0] == "launcher"
    table = bench_table.read_tables(out / f"{bench_table.benchmark_name()}.json")["kept"]
    columns = ["launcher", "setup s", "run 1 s", "runs 2-4 median s", "min s", "x TD"]
    assert table["columns"] == columns
    for line, row in zip(printed[3:5], table["rows"], strict=True):
        label, cells = line[:52].strip(), [bench_table.number(c) for c in line[52:].split()]
        digits = (2, 2, 3, 3, 3)
        expected = [
            None if v is None else round(v, d) for v, d in zip(row[1:], digits, strict=True)
        ]
        assert [label, *cells] == [row[0], *expected]


def test_each_run_replaces_the_file_and_later_tables_join_it(out):
    path = out / "demo.json"
    path.write_text('{"benchmark": "demo", "command": "old", "tables": []}')
    bench_table._written.pop(path, None)
    bench_table.write_table("a", "A", ["x"], [[1]], name="demo")
    bench_table.write_table("b", "B", ["x", "y"], [[2, "2.5"]], name="demo")
    bench_table.write_table("a", "A again", ["x"], [[3]], name="demo")
    document = json.loads(path.read_text())
    assert document["command"] != "old"
    assert [(t["key"], t["rows"]) for t in document["tables"]] == [("b", [[2, 2.5]]), ("a", [[3]])]
    with pytest.raises(ValueError, match="2 cells for 1 columns"):
        bench_table.write_table("c", "C", ["x"], [[1, 2]], name="demo")


def check_image(path: Path) -> None:
    """A non-trivial SVG (an <svg> document) or PNG."""
    data = path.read_bytes()
    assert len(data) > 10_000, f"{path.name}: {len(data)} bytes"
    if path.suffix == ".png":
        assert data.startswith(PNG_SIGNATURE)
    else:
        assert ElementTree.fromstring(data).tag == "{http://www.w3.org/2000/svg}svg"
        assert b"<text" in data  # text kept as text (svg.fonttype none)


@pytest.mark.parametrize("suffix", [".svg", ".png"])
def test_every_figure_draws_from_the_committed_data(tmp_path, suffix, capsys):
    written = figures.draw_all(DATA, tmp_path, suffix)
    names = [name for name, *_ in figures.FIGURES]
    assert sorted(p.name for p in written if p.stem != "recovery") == sorted(
        name + suffix for name in names
    )
    for path in written:
        check_image(path)
    if not (DATA / figures.RECOVERY_TRACE).exists():
        assert "recovery: skipped" in capsys.readouterr().out


def test_the_committed_figures_are_drawn_from_their_data_and_shown_in_the_docs():
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    drawn = [name for name, *_ in figures.FIGURES]
    if (DATA / figures.RECOVERY_TRACE).exists():
        drawn.append("recovery")
    figures_dir = ROOT / "docs" / "figures"
    committed = sorted(p.stem for p in figures_dir.glob("*.svg") if p.stem not in OTHER_FIGURES)
    assert committed == sorted(drawn)
    for name in drawn:
        assert f"](figures/{name}.svg)" in page, f"docs/benchmarks.md does not show {name}"
    for name, shown_in in OTHER_FIGURES.items():
        assert f"](figures/{name}.svg)" in (ROOT / shown_in).read_text(), f"{shown_in}: {name}"
    for data in DATA.glob("*.json"):
        for table in json.loads(data.read_text()).get("tables", []):
            assert table.get("source"), f"{data.name} {table['key']}: no source"


def synthetic_trace(path: Path) -> None:
    """A job of 3 ranks: rank 2 fails at 4 s, the world goes on with 2, and a third rank
    joins again at 8 s; a step every 0.5 s on every rank in the world."""
    driver, events = trace_format.DRIVER, []
    events.append({"name": "process_name", "ph": "M", "ts": 0, "pid": driver, "tid": 0})
    events[-1]["args"] = {"name": "driver"}
    events.append(slice_("attempt 1", 0, 12.0, driver, trace_format.JOB))
    worlds = [(0.0, 4.0, (0, 1, 2)), (4.0, 8.0, (0, 1)), (8.0, 12.0, (0, 1, 2))]
    for g, (start, end, ranks) in enumerate(worlds):
        us = int(start * 1e6)
        events.append(counter(us, len(ranks)))
        events.append(slice_(f"generation {g}", us, end - start, driver, GENERATIONS))
        if g:
            events.append(instant("world change", us, driver, {"ranks": len(ranks)}))
        for rank in ranks:
            pid = trace_format.rank_pid(rank)
            for step in range(int((end - start) / 0.5)):
                ts = int((start + step * 0.5) * 1e6)
                events.append(slice_(f"step {step}", ts, 0.45, pid, trace_format.STEPS))
    for rank in range(3):
        events.append({"name": "process_name", "ph": "M", "ts": 0, "pid": rank + 1, "tid": 0})
        events[-1]["args"] = {"name": f"rank {rank} (host-{rank})"}
    events.append(instant("failure", 3_900_000, trace_format.rank_pid(2), {"reason": "lost"}))
    other = {"sparkdist": {"version": trace_format.VERSION, "name": "elastic 3 -> 2 -> 3"}}
    path.write_text(json.dumps({"traceEvents": events, "otherData": other}))


def counter(ts: int, ranks: int) -> dict:
    return {"name": "world size", "ph": "C", "ts": ts, "pid": 0, "tid": 0, "args": {"ranks": ranks}}


def slice_(name: str, ts: int, seconds: float, pid: int, tid: int) -> dict:
    return {"name": name, "ph": "X", "ts": ts, "dur": int(seconds * 1e6), "pid": pid, "tid": tid}


def instant(name: str, ts: int, pid: int, args: dict) -> dict:
    return {"name": name, "ph": "i", "s": "p", "ts": ts, "pid": pid, "tid": EVENTS, "args": args}


def test_the_recovery_figure_draws_a_world_shrinking_and_growing(tmp_path):
    trace = tmp_path / "trace.json"
    synthetic_trace(trace)
    parts = figures.trace_parts(json.loads(trace.read_text())["traceEvents"])
    assert parts["sizes"] == [(0.0, 3), (4.0, 2), (8.0, 3)]
    assert [name for *_, name in parts["generations"]] == [f"generation {g}" for g in range(3)]
    assert parts["attempts"] == [(0.0, 12.0, "attempt 1")]  # shaded where no generations
    assert parts["changes"] == [4.0, 8.0] and parts["failures"] == [(3.9, 3)]
    assert sorted(parts["steps"]) == [1, 2, 3] and len(parts["steps"][3]) == 16
    assert parts["end"] == pytest.approx(12.0)  # the last generation's end
    for suffix in (".svg", ".png"):
        figures.recovery_figure(trace, tmp_path / f"recovery{suffix}")
        check_image(tmp_path / f"recovery{suffix}")


def test_the_recovery_figure_is_drawn_when_its_trace_is_in_the_data(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    synthetic_trace(data / figures.RECOVERY_TRACE)
    written = figures.draw_all(data, tmp_path / "out")
    assert [p.name for p in written] == ["recovery.svg"]
