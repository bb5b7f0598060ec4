"""What a user sees while waiting: progress displays (`sparkdist.progress`) in a
notebook kernel, a terminal and a log, and sparkdist's own log lines, which show where
the application configured no logging and are set in one place."""

from __future__ import annotations

import io
import logging
import os
import queue
import subprocess
import sys
from pathlib import Path

import pytest

import sparkdist
from sparkdist import progress

ROOT = Path(__file__).resolve().parents[1]

NOTEBOOK_CELL = """
import sparkdist

def main(steps):
    import sparkdist
    for step in range(steps):
        sparkdist.report({"loss": 1.0 / (step + 1)}, step=step)
    return "done"

runner = sparkdist.HorovodRunner(np=-2, launcher="direct")
print("result:", runner.run(main, steps=3))
"""


def run_in_kernel(code: str, timeout: float = 180) -> dict[str, str]:
    """Run `code` in a fresh IPython kernel, as a notebook cell; what it printed on
    stdout and stderr (what the notebook shows under the cell)."""
    from jupyter_client.manager import start_new_kernel

    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    env.pop("SPARKDIST_LOG_LEVEL", None)
    manager, client = start_new_kernel(kernel_name="python3", env=env)
    streams = {"stdout": "", "stderr": ""}
    try:
        msg_id = client.execute(code)
        while True:
            try:
                msg = client.get_iopub_msg(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"the cell did not finish: {streams}") from None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                streams[content["name"]] += content["text"]
            elif kind == "error":
                raise AssertionError("\n".join(content["traceback"]))
            elif kind == "status" and content["execution_state"] == "idle":
                return streams
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_a_notebook_shows_progress_and_info_lines():
    shown = run_in_kernel(NOTEBOOK_CELL)
    assert "result: done" in shown["stdout"]
    err = shown["stderr"]
    assert "INFO sparkdist: sparkdist job " in err and "2 ranks, launcher direct" in err
    assert "succeeded in" in err
    # The reported metrics' progress line (tqdm's text bar: no ipywidgets here), last state.
    assert "sparkdist main: 3 reports" in err and "step=2, loss=0.3333]" in err


def test_plain_lines_when_not_a_terminal_at_most_one_per_interval(caplog):
    assert progress.mode() == "lines"  # pytest captures stderr: not a terminal
    with caplog.at_level(logging.INFO, logger="sparkdist.progress"):
        with progress.bar(100, "sparkdist tune", unit="trial") as bar:
            for _ in range(100):
                bar.update(1, best=0.5)
    lines = [r.getMessage() for r in caplog.records if r.name == "sparkdist.progress"]
    # The first, then none within LINE_INTERVAL_S, then the last.
    assert lines == [
        "sparkdist tune: 1/100 trial (best=0.5)",
        "sparkdist tune: 100/100 trial (best=0.5)",
    ]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_bar(monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert progress.mode() == "terminal"
    with progress.bar(4, "sparkdist ensemble", unit="models") as bar:
        for _ in range(4):
            bar.update(1)
    assert "sparkdist ensemble: 100%" in terminal.getvalue()
    assert "4/4" in terminal.getvalue()


def test_quiet_when_logging_or_the_switch_says_so(monkeypatch):
    before = logging.getLogger("sparkdist").level
    try:
        sparkdist.set_log_level("WARNING")
        assert progress.mode() == "off"
        sparkdist.set_log_level("INFO")
        assert progress.mode() != "off"
        monkeypatch.setenv(progress.PROGRESS_ENV, "0")
        assert progress.mode() == "off"
    finally:
        logging.getLogger("sparkdist").setLevel(before)
    with pytest.raises(ValueError, match="SPARKDIST_LOG_LEVEL=WARNING"):
        sparkdist.set_log_level("LOUD")


LOG_SCRIPT = """
import logging, sys
if sys.argv[1] == "configured":
    logging.basicConfig(level=logging.WARNING, format="app: %(name)s %(message)s")
import sparkdist
logging.getLogger("sparkdist.runner.driver.job").info("job started")
logging.getLogger("sparkdist.tune").warning("trial failed")
"""


@pytest.mark.parametrize(
    ("how", "level", "expected"),
    [
        ("bare", None, ["INFO sparkdist: job started", "WARNING sparkdist: trial failed"]),
        ("bare", "WARNING", ["WARNING sparkdist: trial failed"]),
        # The application's own handler prints them, once, in its format.
        (
            "configured",
            None,
            ["app: sparkdist.runner.driver.job job started", "app: sparkdist.tune trial failed"],
        ),
    ],
)
def test_sparkdist_log_lines_show_where_no_logging_is_configured(how, level, expected):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("SPARKDIST_LOG_LEVEL", None)
    if level:
        env["SPARKDIST_LOG_LEVEL"] = level
    done = subprocess.run(
        [sys.executable, "-c", LOG_SCRIPT, how],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stderr.splitlines() == expected
