"""The picture in a notebook: a notebook executed by nbclient in a real IPython kernel shows
a `Timeline` as `text/html` with a row per rank, from a saved trace and from a real job's
`runner.last_job.timeline()`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from traces import job_trace

from sparkdist.trace import format

LOAD_CELL = """
from sparkdist.trace.picture import Timeline

timeline = Timeline.load(JOB_DIR)
print("slowest:", timeline.slowest_rank)
"""

JOB_CELL = """
import sparkdist

def main():
    import os, time
    import sparkdist
    rank = int(os.environ["RANK"])
    for step in range(3):
        time.sleep(0.05 * (1 + 3 * rank))
        sparkdist.report({"loss": 1.0 / (step + 1)}, step=step)

runner = sparkdist.HorovodRunner(np=-2, launcher="direct")
runner.run(main)
"""


def execute(cells: list[str], directory: Path) -> list[dict]:
    """Run `cells` as a notebook in a fresh kernel; each code cell's outputs."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    client = NotebookClient(
        notebook,
        timeout=240,
        kernel_name="python3",
        resources={"metadata": {"path": str(directory)}},
    )
    client.execute()
    nbformat.validate(notebook)
    return [cell.outputs for cell in notebook.cells]


def shown_html(outputs: list[dict]) -> str:
    """The `text/html` the notebook shows for a cell (its result or a display)."""
    (shown,) = [o for o in outputs if o["output_type"] in ("execute_result", "display_data")]
    return shown["data"]["text/html"]


def rank_rows(markup: str) -> list[str]:
    return re.findall(r'<g class="rank-row[^"]*" data-rank="(\d+)"', markup)


def test_a_saved_trace_shows_a_row_per_rank(tmp_path):
    (tmp_path / format.FILE_NAME).write_text(json.dumps(job_trace([100, 300, 100, 100])))
    outputs = execute(
        [f"JOB_DIR = {str(tmp_path)!r}", LOAD_CELL, "timeline", "display(timeline)"], tmp_path
    )
    assert outputs[1][0]["text"] == "slowest: 1\n"
    for cell in (outputs[2], outputs[3]):  # the cell's value, and display()
        markup = shown_html(cell)
        assert rank_rows(markup) == ["0", "1", "2", "3"]
        assert 'class="rank-row slowest" data-rank="1"' in markup
        assert "<script" not in markup and "http" not in markup


def test_a_real_jobs_timeline_shows_in_the_notebook(tmp_path):
    outputs = execute([JOB_CELL, "runner.last_job.timeline()"], tmp_path)
    markup = shown_html(outputs[1])
    assert rank_rows(markup) == ["0", "1"]
    assert 'class="rank-row slowest" data-rank="1"' in markup  # its steps are 4x longer
