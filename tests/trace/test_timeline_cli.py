"""`sparkdist timeline JOB_DIR` writes the page and the picture of a job's trace, and
`sparkdist run` says where the trace is: on a saved trace, and on a real job's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_cli
from traces import job_trace

from sparkdist.trace import format, validate

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def check_outputs(paths: list[str], ranks: int) -> None:
    html, png = (Path(p) for p in paths)
    assert html.name == "timeline.html" and png.name == "timeline.png"
    page = html.read_text()
    assert len(re.findall(r'<g class="rank-row', page)) == ranks
    assert "<script" not in page and "http" not in page
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_timeline_writes_the_page_and_the_picture(capsys, tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / format.FILE_NAME).write_text(json.dumps(job_trace([100, 300, 100])))
    code, out, err = run_cli(capsys, "timeline", str(job))
    assert code == 0, err
    paths = out.split()
    assert paths == [str(job / "timeline.html"), str(job / "timeline.png")]
    check_outputs(paths, ranks=3)
    # --out elsewhere (made if missing), and the trace file itself as the argument.
    out_dir = tmp_path / "figures" / "job"
    code, out, _ = run_cli(capsys, "timeline", str(job / format.FILE_NAME), "--out", str(out_dir))
    assert code == 0 and out.split() == [
        str(out_dir / n) for n in ("timeline.html", "timeline.png")
    ]
    check_outputs(out.split(), ranks=3)


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no trace.json in {job} (give a job's directory)"),
        ("{not json", "cannot read the trace in {job}: Expecting property name enclosed in"),
        ('{"events": []}', "cannot read the trace in {job}: not a trace: expected an object"),
    ],
)
def test_no_trace_is_one_line_and_exit_2(capsys, tmp_path, content, message):
    if content is not None:
        (tmp_path / format.FILE_NAME).write_text(content)
    code, out, err = run_cli(capsys, "timeline", str(tmp_path))
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("sparkdist timeline: error: " + message.format(job=tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if content is None else ["trace.json"])


def test_a_missing_directory_is_one_line_and_exit_2(capsys, tmp_path):
    code, _, err = run_cli(capsys, "timeline", str(tmp_path / "gone"))
    assert code == 2
    gone = tmp_path / "gone"
    assert err == f"sparkdist timeline: error: no trace.json in {gone} (give a job's directory)\n"


SLOW_RANK = """
import os, time
import sparkdist
rank = int(os.environ["RANK"])
for step in range(4):
    time.sleep(0.05 if rank == 0 else 0.2)
    sparkdist.report({"loss": 1.0 / (step + 1)}, step=step)
"""


def test_run_prints_where_the_trace_is_and_timeline_draws_it(tmp_path):
    """A real job (two ranks as processes here, rank 1 four times slower)."""
    script = tmp_path / "train.py"
    script.write_text(SLOW_RANK)
    command = [sys.executable, "-m", "sparkdist", "run", "--np", "-2", "--launcher", "direct"]
    done = subprocess.run(
        [*command, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    found = re.search(
        r"^sparkdist run: trace: (\S+) \(draw it: sparkdist timeline (\S+)\)$", done.stderr, re.M
    )
    assert found, done.stderr
    trace, job_dir = Path(found.group(1)), Path(found.group(2))
    assert trace.name == format.FILE_NAME and trace.parent == job_dir
    validate.check(json.loads(trace.read_text()))
    drawn = subprocess.run(
        [sys.executable, "-m", "sparkdist", "timeline", str(job_dir), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert drawn.returncode == 0, drawn.stderr
    check_outputs(drawn.stdout.split(), ranks=2)
    page = (tmp_path / "timeline.html").read_text()
    assert re.search(r'<g class="rank-row slowest" data-rank="1">', page)
