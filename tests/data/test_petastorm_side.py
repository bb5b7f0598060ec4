"""sparkdist.data on the stack where petastorm still works, checked in CI.

The main environment (pyspark 4, pyarrow >= 18, numpy 2) cannot import petastorm, so the
petastorm branch of the converter runs in a side environment, .venv-petastorm (Spark 3.5,
pyarrow 14, numpy 1.26, petastorm 0.13.1, torch; `make petastorm-side`, which `make test`
runs first). tests/scripts/petastorm_side_check.py runs there with a real local Spark 3.5
and reports what it saw; this test checks it. In CI (CI=true) a missing side environment
fails the test; elsewhere it skips with the command that makes it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "petastorm_side_check.py"
SIDE_VENV = Path(os.environ.get("SPARKDIST_PETASTORM_VENV", ROOT / ".venv-petastorm"))
N_ROWS = 1000
# Variables of the main environment that would point the Spark 3.5 side at the wrong stack.
NOT_INHERITED = (
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
    "SPARK_HOME",
    "PYTHONPATH",
    "PYTHONHOME",
    "VIRTUAL_ENV",
)


def side_python() -> Path:
    python = SIDE_VENV / "bin" / "python"
    if python.exists():
        return python
    message = f"the petastorm side environment {SIDE_VENV} is missing: run `make petastorm-side`"
    if os.environ.get("CI") == "true":
        pytest.fail(message + " (make test does it first; in CI this is a broken install)")
    pytest.skip(message)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    python = side_python()
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=str(python),
        PYSPARK_DRIVER_PYTHON=str(python),
        PYTHONWARNINGS="ignore",  # petastorm on pyarrow 14 warns about every legacy call
    )
    cache = tmp_path_factory.mktemp("petastorm-cache")
    done = subprocess.run(
        [str(python), str(SCRIPT), str(cache)],
        env=env,
        cwd=cache,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (
        f"{SCRIPT.name} failed in {SIDE_VENV} (exit {done.returncode}):\n"
        f"{done.stderr[-4000:]}\n{done.stdout[-2000:]}"
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_side_environment_is_the_petastorm_stack(report):
    versions = report["versions"]
    assert versions["petastorm"] == "0.13.1"
    assert versions["pyspark"].startswith("3.5.")
    assert int(versions["pyarrow"].split(".")[0]) < 15
    assert int(versions["numpy"].split(".")[0]) < 2
    # The code under test is this checkout's, not some installed copy.
    assert Path(report["sparkdist_file"]).resolve().is_relative_to(ROOT)


def test_converter_uses_petastorm_when_asked_and_logs_it(report):
    assert report["backend"] == "petastorm"
    assert "sparkdist.data: using petastorm 0.13.1 (asked for)" in report["log"]
    assert report["len"] == N_ROWS
    assert report["row_groups"] >= 2  # petastorm shards by row group
    loaders = {shard["loader"] for shard in report["shards"]}
    assert loaders == {"petastorm.pytorch.DataLoader"}


@pytest.mark.parametrize("key", ["shards", "pyarrow_shards"])
def test_shards_read_every_row_exactly_once(report, key):
    shards = report[key]
    assert len(shards) == 2
    assert all(shard["ids"] for shard in shards), "a shard read nothing"
    everything = [i for shard in shards for i in shard["ids"]]
    assert sorted(everything) == list(range(N_ROWS))


@pytest.mark.parametrize("key", ["shards", "pyarrow_shards"])
def test_vectors_become_float_arrays(report, key):
    expected = np.asarray(report["expected_features"], dtype=np.float32)
    for shard in report[key]:
        assert shard["feature_types"] == ["Tensor:torch.float32"]
        ids = np.asarray(shard["ids"])
        features = np.asarray(shard["features"], dtype=np.float32)
        assert features.shape == (len(ids), 3)
        np.testing.assert_array_equal(features, expected[ids])  # dense and sparse rows
        np.testing.assert_array_equal(shard["labels"], ids % 3)


def test_pyarrow_reader_shares_the_cache(report):
    assert {shard["backend"] for shard in report["pyarrow_shards"]} == {"pyarrow"}
    assert report["same_cache_for_pyarrow"]  # the same DataFrame is not written twice


def test_delete_removes_the_cache(report):
    assert report["cache_dir_existed"]
    assert not report["cache_dir_after_delete"]
    assert "removed the copy at " in " ".join(report["log"])  # logged with its size
    assert "files; deleted)" in " ".join(report["log"])
