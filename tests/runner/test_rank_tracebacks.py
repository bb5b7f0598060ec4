"""A failing rank's traceback names the user's file and shows its source lines, under
the lock's cloudpickle and under the newest release (3.1.3 and later write
"<dynamic-code>" as the file of every function they pickle by value).

The job runs in a child process (its own Spark) whose PYTHONPATH puts the newest
cloudpickle first, for the driver and, through the driver's PYTHONPATH, for the ranks.
A single-node tune trial's traceback is checked there too. The functions come from a
"notebook cell": code compiled under a name that is no file anywhere, with its lines only
in the driver's linecache, as IPython registers a cell.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LATEST_CLOUDPICKLE = REPO / ".venv-cloudpickle-latest"
"""Made by `make bootstrap`: pip install --target .venv-cloudpickle-latest cloudpickle==3.1.3"""

CELL = textwrap.dedent(
    """\
    def helper(rank):
        import cloudpickle
        raise ValueError(f"boom from rank {rank} under cloudpickle {cloudpickle.__version__}")


    def raising():
        import os
        if os.environ["RANK"] == "1":
            helper(1)


    def objective(trial):
        helper(0)
    """
)

CHILD = textwrap.dedent(
    """
    import json, linecache, sys
    import cloudpickle
    from pyspark.sql import SparkSession
    from sparkdist import HorovodRunner, RankFailedError

    cell = sys.argv[1]
    linecache.cache["<cell-7>"] = (len(cell), None, cell.splitlines(True), "<cell-7>")
    namespace = {"__name__": "__main__"}
    exec(compile(cell, "<cell-7>", "exec"), namespace)

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    out = {"driver": cloudpickle.__version__}
    for np_ in (2, -2):
        try:
            HorovodRunner(np=np_, start_timeout=120, timeout=120).run(namespace["raising"])
        except RankFailedError as exc:
            out[str(np_)] = exc.traceback
    # A single-node tune trial: its traceback too.
    import optuna
    import sparkdist.tune

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study()
    sparkdist.tune.optimize(study, namespace["objective"], n_trials=1, parallelism=1)
    out["tune"] = study.trials[0].user_attrs["traceback"]
    print("RESULT " + json.dumps(out), flush=True)
    spark.stop()
    """
)


def _run_child(tmp_path: Path, pythonpath: list[str]) -> dict:
    script = tmp_path / "job.py"
    script.write_text(CHILD)
    env = dict(os.environ)
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["PYTHONPATH"] = os.pathsep.join(p for p in [*pythonpath, env.get("PYTHONPATH")] if p)
    proc = subprocess.run(
        [sys.executable, str(script), CELL],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=400,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(lines[-1][len("RESULT ") :])


def _lock_version() -> str:
    import cloudpickle

    return cloudpickle.__version__


@pytest.mark.parametrize("cloudpickle_from", ["lock", "latest"])
def test_rank_traceback_shows_the_cell_s_lines(tmp_path, cloudpickle_from):
    if cloudpickle_from == "latest":
        if not (LATEST_CLOUDPICKLE / "cloudpickle").is_dir():
            pytest.fail(
                f"{LATEST_CLOUDPICKLE} is missing; make it with: .venv/bin/python -m pip "
                "install --target .venv-cloudpickle-latest cloudpickle==3.1.3"
            )
        pythonpath = [str(LATEST_CLOUDPICKLE)]
        expected = "3.1.3"
    else:
        pythonpath = []
        expected = _lock_version()

    out = _run_child(tmp_path, pythonpath)

    assert out["driver"] == expected
    for np_ in ("2", "-2"):
        traceback = out[np_]
        # The rank unpickled with the same cloudpickle as the driver.
        assert f"ValueError: boom from rank 1 under cloudpickle {expected}" in traceback
        assert "<dynamic-code>" not in traceback
        assert 'File "<cell-7>", line 9, in raising\n    helper(1)' in traceback
        assert 'File "<cell-7>", line 3, in helper\n    raise ValueError(f"boom from' in traceback
    assert f"ValueError: boom from rank 0 under cloudpickle {expected}" in out["tune"]
    assert 'File "<cell-7>", line 13, in objective\n    helper(0)' in out["tune"]
