"""A job's picture (sparkdist/trace/picture.py) from synthetic traces: the per-rank
summary, the slowest rank, failures and world changes in the SVG, an HTML page that
loads nothing, and a PNG of plausible size."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pytest
from traces import MS, counter, job_trace

from sparkdist.trace import format
from sparkdist.trace.picture import Timeline

SVG = "{http://www.w3.org/2000/svg}"


def rows_of(markup: str) -> list[str]:
    """The data-rank of each rank row, in order."""
    return re.findall(r'<g class="rank-row[^"]*" data-rank="(\d+)"', markup)


def test_the_summary_and_the_slowest_rank():
    trace = job_trace([100, 300, 100], steps=10, wait_share=[0.25, 0.1, 0.5])
    timeline = Timeline(trace)
    assert [r.rank for r in timeline.ranks] == [0, 1, 2]
    assert timeline.slowest_rank == 1
    slow = timeline.ranks[1]
    assert slow.host == "host-1" and slow.steps == 10
    assert slow.mean_step_s == pytest.approx(0.3)
    assert slow.busy_s == pytest.approx(3.0)  # its main: 10 steps of 0.3 s
    assert slow.data_wait_s == pytest.approx(0.3)
    shares = [r.data_wait_share for r in timeline.ranks]
    assert shares == pytest.approx([0.25, 0.1, 0.5])
    assert [r.failures for r in timeline.ranks] == [(), (), ()]
    assert [r.peak_gpu_mib for r in timeline.ranks] == [None, None, None]  # CPU: no counter


def test_merged_steps_count_as_many():
    """A lane merged past its cap keeps the steps' count in args["steps"]."""
    trace = job_trace([100])
    steps = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == format.STEPS]
    first, second = steps[0], steps[1]
    first["dur"] += second["dur"]
    first["name"], first["args"]["steps"] = "steps 0-1", 2
    trace["traceEvents"].remove(second)
    (rank,) = Timeline(trace).ranks
    assert rank.steps == 10 and rank.mean_step_s == pytest.approx(0.1)


def test_no_steps_no_slowest_rank_and_gpu_peaks():
    trace = job_trace([100, 100], steps=0, gpu_mib={0: [512.0, 2048.5, 1024.0]})
    timeline = Timeline(trace)
    assert timeline.slowest_rank is None
    assert [r.mean_step_s for r in timeline.ranks] == [None, None]
    assert [r.peak_gpu_mib for r in timeline.ranks] == [2048.5, None]
    assert [r.gpu_percent for r in timeline.ranks] == [None, None]  # no NVML samples
    svg = timeline.svg()
    assert "2,048 MiB" in svg and "slowest" not in svg


def test_nvml_s_utilisation_shows_beside_the_gpu_peak():
    trace = job_trace([100], steps=0, gpu_mib={0: [512.0]})
    pid = format.rank_pid(0)
    for ts, percent in ((1000, 80.0), (2000, 90.0)):
        trace["traceEvents"].append(counter(pid, "gpu utilisation", ts, percent=percent))
    timeline = Timeline(trace)
    assert timeline.ranks[0].gpu_percent == 85.0
    assert "512 MiB · 85%" in timeline.svg()


def test_the_svg_marks_the_slowest_rank_a_failure_and_world_changes():
    reason = 'RuntimeError: <CUDA> & "out of memory"'
    trace = job_trace([100, 300, 100], failures={2: reason}, world=[(200 * MS, 3), (900 * MS, 2)])
    timeline = Timeline(trace)
    svg = timeline.svg()
    root = ET.fromstring(svg)  # well-formed XML: every text escaped
    rows = root.findall(f"{SVG}g[@class]")
    rank_rows = [g for g in rows if g.get("class").startswith("rank-row")]
    assert [g.get("data-rank") for g in rank_rows] == ["0", "1", "2"]
    assert [g.get("class") for g in rank_rows] == ["rank-row", "rank-row slowest", "rank-row"]
    assert "slowest" in "".join(rank_rows[1].itertext())
    # The failure: a red mark on rank 2's row, the reason in its tooltip.
    failures = [g for g in rank_rows[2].iter(f"{SVG}g") if g.get("class") == "failure"]
    assert len(failures) == 1
    assert failures[0].find(f"{SVG}title").text == f"failure at 1.07 s: {reason}"  # main ended
    assert not any(g.get("class") == "failure" for g in rank_rows[0].iter(f"{SVG}g"))
    assert "&lt;CUDA&gt; &amp; &quot;out of memory&quot;" in svg
    # World changes: a line through the rows with the new size.
    changes = [g for g in rows if g.get("class") == "world-change"]
    assert [g.get("data-size") for g in changes] == ["3", "2"]
    assert [w.size for w in timeline.world_changes] == [3, 2]
    assert timeline.world_changes[1].t_s == pytest.approx(0.9)
    assert [size for _, size in timeline.world_sizes] == [3, 3, 2]
    # The columns: data-wait share, mean step, "-" for no GPU.
    texts = "".join(rank_rows[1].itertext())
    assert "25%" in texts and "0.3 s" in texts and "-" in texts


def test_host_names_are_escaped():
    trace = job_trace([100])
    names = [e for e in trace["traceEvents"] if e.get("name") == "process_name"]
    names[1]["args"]["name"] = "rank 0 (<img src=x onerror=alert(1)>)"
    markup = Timeline(trace)._repr_html_()
    assert "<img" not in markup and "&lt;img src=x onerror=alert(1)&gt;" in markup


def test_html_has_a_row_per_rank_and_loads_nothing(tmp_path):
    timeline = Timeline(job_trace([100, 300, 100], failures={0: "see https://x.y/z"}))
    fragment = timeline._repr_html_()
    assert rows_of(fragment) == ["0", "1", "2"]
    page = timeline.to_html()
    assert page.startswith("<!DOCTYPE html>") and rows_of(page) == ["0", "1", "2"]
    for markup in (fragment, page):
        # The failure reason names a URL: as text, escaped, never as a reference.
        without_reason = markup.replace("see https://x.y/z", "")
        assert "http://" not in without_reason and "https://" not in without_reason
        assert "//" not in without_reason
        assert "<script" not in markup.lower() and "javascript:" not in markup.lower()
        assert not re.search(r"\b(href|src|xlink:href)\s*=", markup)
        assert "@import" not in markup and "url(" not in markup
    # The standalone SVG names its namespace (a name, not a place it loads), nothing else.
    assert re.findall(r"https?://[^\"' ]+", timeline.svg().replace("https://x.y/z", "")) == [
        "http://www.w3.org/2000/svg"
    ]
    saved = timeline.save_html(tmp_path / "timeline.html")
    assert open(saved, encoding="utf-8").read() == page


def test_save_and_load_round_trip(tmp_path):
    trace = job_trace([100, 200])
    timeline = Timeline(trace)
    path = timeline.save(tmp_path / format.FILE_NAME)
    assert json.loads(open(path).read()) == trace
    assert Timeline.load(tmp_path).ranks == timeline.ranks  # the job's directory
    assert Timeline.load(path).slowest_rank == 1
    with pytest.raises(FileNotFoundError, match="no trace at"):
        Timeline.load(tmp_path / "elsewhere")


def test_not_a_trace_is_refused_and_a_flawed_one_drawn_with_a_warning(caplog):
    with pytest.raises(ValueError, match="traceEvents"):
        Timeline({"events": []})
    trace = job_trace([100, 100])
    trace["traceEvents"].append({"name": "step", "ph": "X", "ts": 0, "pid": 2, "tid": 2})
    trace["traceEvents"].append({"name": "step", "ph": "X", "ts": "0", "pid": 2, "tid": 2})
    timeline = Timeline(trace)
    assert "the trace has 3 problem(s)" in caplog.text  # no dur twice, a text ts
    assert len(rows_of(timeline.svg())) == 2


def test_a_long_job_stays_small():
    """10,000 steps per rank: narrow steps merge into a shape per couple of pixels."""
    trace = job_trace([2, 3, 2, 2], steps=10_000, wait_share=0.1)
    svg = Timeline(trace).svg()
    assert len(svg) < 1_000_000, len(svg)
    assert rows_of(svg) == ["0", "1", "2", "3"]


def test_to_png_draws_rows_per_rank(tmp_path):
    from matplotlib.image import imread

    timeline = Timeline(job_trace([100, 300, 100], failures={1: "boom"}, world=[(MS, 3)]))
    path = timeline.to_png(tmp_path / "timeline.png")
    image = imread(path)
    height, width, channels = image.shape
    assert width == 1200 and 250 <= height <= 400 and channels in (3, 4)
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # More ranks, a taller picture: a row per rank.
    taller = Timeline(job_trace([100] * 8)).to_png(tmp_path / "eight.png")
    assert imread(taller).shape[0] > height + 200
