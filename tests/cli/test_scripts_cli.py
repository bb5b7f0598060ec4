"""Scripts on every rank, the `sparkdist` command, and spark-submit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkdist import HorovodRunner, RankFailedError

SCRIPT = Path(__file__).parents[1] / "scripts" / "train_digits.py"
VENV_BIN = Path(sys.executable).parent


def test_script_runs_as_main_with_args(sc, tmp_path):
    script = tmp_path / "show.py"
    script.write_text(
        "import os, sys, json\n"
        "if __name__ == '__main__':\n"
        "    out = sys.argv[sys.argv.index('--dir') + 1]\n"
        "    with open(os.path.join(out, os.environ['RANK']), 'w') as f:\n"
        "        json.dump(sys.argv[1:], f)\n"
    )
    HorovodRunner(np=2).run(str(script), args=["--dir", str(tmp_path), "--x", "1"])
    for rank in ("0", "1"):
        assert json.loads((tmp_path / rank).read_text()) == ["--dir", str(tmp_path), "--x", "1"]


def test_script_failure_has_traceback_and_exit_code(sc, tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(
        "import os\n"
        "def step():\n"
        "    if os.environ['RANK'] == '1':\n"
        "        raise RuntimeError('bad batch in script')\n"
        "step()\n"
    )
    with pytest.raises(RankFailedError) as info:
        HorovodRunner(np=2).run(str(script))
    error = info.value
    assert error.rank == 1 and error.exit_code == 1
    assert "raise RuntimeError('bad batch in script')" in error.traceback
    assert f'File "{script}", line 4, in step' in error.traceback


def test_script_nonzero_exit_is_an_error(sc, tmp_path):
    with pytest.raises(RankFailedError) as info:
        HorovodRunner(np=-2).run(str(SCRIPT), args=["--out", "x", "--fail-on-rank", "1"])
    assert info.value.rank == 1 and info.value.exit_code == 3
    assert "sys.exit(3)" in str(info.value)


def test_script_bad_arguments_fail_early():
    with pytest.raises(FileNotFoundError):
        HorovodRunner(np=2).run("/no/such/train.py")
    with pytest.raises(ValueError, match="args="):
        HorovodRunner(np=2).run(str(SCRIPT), epochs=3)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    env.update(PYSPARK_DRIVER_PYTHON=sys.executable)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env['PATH']}"
    return env


def _run_args(out) -> list[str]:
    """`sparkdist run` of the training script on 2 ranks, its result written to `out`."""
    return ["run", "--np", "2", str(SCRIPT), "--", "--epochs", "8", "--out", str(out)]


def test_sparkdist_run_command(tmp_path):
    out = tmp_path / "result.json"
    done = subprocess.run(
        [VENV_BIN / "sparkdist", *_run_args(out)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(out.read_text())["accuracy"] >= 0.9
    assert "[rank 0] epoch  8" in done.stdout
    assert "finished on 2 ranks" in done.stderr


def test_spark_submit(tmp_path):
    out = tmp_path / "result.json"
    entry = subprocess.run(
        [VENV_BIN / "sparkdist", "entrypoint"], capture_output=True, text=True, check=True
    ).stdout.strip()
    done = subprocess.run(
        [
            VENV_BIN / "spark-submit",
            "--master",
            "local-cluster[2,1,1024]",
            "--conf",
            "spark.driver.host=127.0.0.1",
            "--conf",
            "spark.driver.bindAddress=127.0.0.1",
            "--conf",
            "spark.executor.memory=1g",
            "--conf",
            "spark.ui.enabled=false",
            entry,
            *_run_args(out),
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(out.read_text())["accuracy"] >= 0.9
    # spark-submit merges the Python driver's stderr into its stdout.
    assert "finished on 2 ranks" in done.stdout
