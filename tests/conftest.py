"""Shared fixtures: one real Spark for the whole test session.

`local-cluster[2,1,1024]` starts two real executor JVMs (each with its own Python
workers), so barrier stages behave as on a multi-host cluster. Everything listens on
127.0.0.1.
"""

from __future__ import annotations

import logging
import os
import sys

import pytest
from mlflow_fixture import driver_mlflow, embedded_mlflow, mlflow_server  # noqa: F401 - fixtures

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# py-spy's native stacks cost a stack dump 0.1-3 s (more under load, with torch): only
# the tests of them turn it on (test_stacks.py, `SPARKDIST_PY_SPY=""` in the job's env).
os.environ.setdefault("SPARKDIST_PY_SPY", "off")

SPARK_MASTER = os.environ.get("SPARKDIST_TEST_MASTER", "local-cluster[2,1,1024]")
# The compatibility suite runs in each runtime's own environment (`make compat`), not here.
collect_ignore = ["compat"]


@pytest.fixture(autouse=True)
def _logging_restored():
    """The CLI's `main` (run in-process by test_cli and test_demo) configures logging as
    the command does: a root handler, `sparkdist` and `sparkdist.progress` levels. Put
    them back after every test, so later modules see the logging they set themselves."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    names = ("sparkdist", "sparkdist.progress")
    levels = {name: logging.getLogger(name).level for name in names}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, saved in levels.items():
        logging.getLogger(name).setLevel(saved)


def build_spark(master: str = SPARK_MASTER):
    from sparkdist.spark.session import embedded_spark

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
