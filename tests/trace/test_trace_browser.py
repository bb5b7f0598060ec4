"""The saved timeline page in a real browser: headless Chromium (Debian's `chromium`, which
init_scripts/install_system.sh installs) opens it from a file:// URL, its DOM has a row
per rank, and its screenshot shows them: one band of the row tab's colour per rank, the
slowest rank's in its own colour, the failure's red in the failing rank's band. The
screenshot is kept under artifacts/trace/ (or $SPARKDIST_TEST_ARTIFACTS/trace/)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from traces import job_trace

from sparkdist.trace import picture
from sparkdist.trace.picture import COLOURS, ROW_H, TAB_W, Timeline

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("SPARKDIST_TEST_ARTIFACTS", ROOT / "artifacts")) / "trace"
MARGIN = 16
"""The page's body margin (Timeline.to_html): where the SVG's left edge lands."""
WINDOW = (1280, 600)


@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.skip(
            "no chromium on PATH: `bash init_scripts/install_system.sh` (run by `make test`) "
            "installs Debian's chromium; where it cannot be installed this test does not run"
        )
    return path


def run_chromium(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless, offline, with a profile of its own; nothing kept running after."""
    command = [
        chromium,
        "--headless",
        "--no-sandbox",  # as root
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--user-data-dir={profile}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def bands(column: np.ndarray, colour: str) -> list[tuple[int, int]]:
    """The (first, last) rows of each run of pixels of `colour` in a column of RGB bytes."""
    rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])
    hits = np.abs(column.astype(int) - rgb).max(axis=1) <= 6
    runs, start = [], None
    for y, hit in enumerate(hits):
        if hit and start is None:
            start = y
        elif not hit and start is not None:
            runs.append((start, y - 1))
            start = None
    if start is not None:
        runs.append((start, len(hits) - 1))
    return runs


def test_the_page_in_chromium_has_a_row_per_rank(chromium, tmp_path):
    reason = "RuntimeError: rank 2 <lost> its GPU"
    timeline = Timeline(job_trace([100, 300, 100], failures={2: reason}, world=[(250_000, 3)]))
    page = Path(timeline.save_html(tmp_path / "timeline.html"))
    url = page.as_uri()

    dom = run_chromium(chromium, tmp_path / "profile-dom", "--dump-dom", url).stdout
    rows = re.findall(r'<g class="(rank-row[^"]*)" data-rank="(\d+)"', dom)
    assert rows == [("rank-row", "0"), ("rank-row slowest", "1"), ("rank-row", "2")], dom[-2000:]
    assert "&lt;lost&gt;" in dom and "<lost>" not in dom

    shot = tmp_path / "timeline.png"
    run_chromium(chromium, tmp_path / "profile-shot", f"--screenshot={shot}", url)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    kept = ARTIFACTS / "timeline-chromium.png"
    shutil.copyfile(shot, kept)
    shutil.copyfile(page, ARTIFACTS / "timeline.html")

    from matplotlib.image import imread

    pixels = np.rint(imread(kept)[:, :, :3] * 255).astype(np.uint8)
    assert pixels.shape[:2] == (WINDOW[1], WINDOW[0])
    tabs = pixels[:, MARGIN + TAB_W // 2]  # the column through every row's tab
    plain, slowest = bands(tabs, COLOURS["tab"]), bands(tabs, COLOURS["slowest tab"])
    assert len(plain) == 2 and len(slowest) == 1, (plain, slowest)
    every = sorted(plain + slowest)
    assert every[1] == slowest[0]  # rank 1's row, the second
    assert all(abs(last - first + 1 - ROW_H) <= 2 for first, last in every), every
    # Among the rows, the failure's red is drawn inside rank 2's band only.
    top, bottom = every[0][0], every[-1][1]
    plot = pixels[
        top : bottom + 1, MARGIN + picture.PLOT_X : MARGIN + picture.PLOT_X + picture.PLOT_W
    ]
    red = np.array([int(COLOURS["failure"][i : i + 2], 16) for i in (1, 3, 5)])
    red_rows = top + np.nonzero((np.abs(plot.astype(int) - red).max(axis=2) <= 6).any(axis=1))[0]
    first, last = every[2]
    assert len(red_rows) and first <= red_rows.min() and red_rows.max() <= last, red_rows
