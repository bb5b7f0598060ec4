"""Shared fixtures: one real Spark for the whole test session.

`local-cluster[2,1,1024]` starts two real executor JVMs (each with its own Python
workers), so barrier stages behave as on a multi-host cluster. Everything listens on
127.0.0.1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow_fixture import driver_mlflow, embedded_mlflow, mlflow_server  # noqa: F401 - fixtures

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

SPARK_MASTER = os.environ.get("SPARKDIST_TEST_MASTER", "local-cluster[2,1,1024]")


def build_spark(master: str = SPARK_MASTER):
    from sparkdist.session import embedded_spark

    conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"}
    return embedded_spark(app_name="sparkdist-tests", master=master, conf=conf)


@pytest.fixture(scope="session")
def spark():
    """The session's SparkSession (local-cluster with two executors)."""
    session = build_spark()
    yield session
    session.stop()


@pytest.fixture(scope="session")
def sc(spark):
    return spark.sparkContext


FAKE_GPU_DISCOVERY = Path(__file__).parent / "fake_gpu_discovery.sh"


def run_with_fake_gpus(script_text: str, tmp_path: Path) -> dict:
    """Run `script_text` as a child Python process that starts its own Spark with fake
    GPUs (its argv[1] is the discovery script); return the dict it printed as its last
    `RESULT {json}` line. A child, because one process may hold one SparkContext."""
    script = tmp_path / "gpu_job.py"
    script.write_text(script_text)
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)  # the driver's own view: no restriction
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    proc = subprocess.run(
        [sys.executable, str(script), str(FAKE_GPU_DISCOVERY)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=400,
    )  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(lines[-1][len("RESULT ") :])
