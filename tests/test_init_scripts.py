"""init_scripts/sparkdist_init.sh for real, on this machine's .venv: the already-installed
path (what a node restart sees) does nothing but check, and failures say what is wrong."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parent.parent
INIT = REPO / "init_scripts" / "sparkdist_init.sh"


def run_init(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    log = tmp_path / "init.log"
    return subprocess.run(
        ["bash", str(INIT)],
        env={**os.environ, "PYTHON": sys.executable, "SPARKDIST_INIT_LOG": str(log), **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_init_script_on_an_installed_node(tmp_path):
    done = run_init(tmp_path, SPARKDIST_CONF_DEST=str(tmp_path / "conf"))
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "init.log").read_text()
    assert "system packages present" in log
    assert "already installed and working" in log  # Horovod: no rebuild
    assert "sparkdist 0.1.0 already installed" in log
    assert "sparkdist can run here." in log and "sparkdist is ready" in log
    # conf/ went where it was asked, the discovery script executable.
    assert os.access(tmp_path / "conf" / "gpu_discovery.sh", os.X_OK)
    assert (tmp_path / "conf" / "spark-defaults.conf").exists()


def test_init_script_fails_clearly(tmp_path):
    missing = tmp_path / "nothing.whl"
    done = run_init(tmp_path, SPARKDIST_PACKAGE=str(missing), SPARKDIST_SKIP_HOROVOD="1")
    assert done.returncode == 1
    assert f"FAILED at step 'sparkdist': SPARKDIST_PACKAGE={missing}: no such wheel file" in (
        done.stderr
    )
    assert "FAILED" in (tmp_path / "init.log").read_text()


def test_init_script_copied_away_from_its_checkout(tmp_path):
    """Databricks runs a copy of the script: without SPARKDIST_HOME it says so."""
    copy = tmp_path / "copy.sh"
    copy.write_text(INIT.read_text())
    done = subprocess.run(
        ["bash", str(copy)],
        env={**os.environ, "PYTHON": sys.executable, "SPARKDIST_INIT_LOG": str(tmp_path / "l")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "set SPARKDIST_HOME" in done.stderr
