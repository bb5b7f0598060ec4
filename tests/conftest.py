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
from helpers import build_spark, small_groups_converter
from mlflow_fixture import driver_mlflow, embedded_mlflow, mlflow_server  # noqa: F401 - fixtures

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# py-spy's native stacks cost a stack dump 0.1-3 s (more under load, with torch): only the
# tests of them turn it on (tests/runner/test_stacks.py, `SPARKDIST_PY_SPY=""` in the job's
# env).
os.environ.setdefault("SPARKDIST_PY_SPY", "off")

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


@pytest.fixture(scope="session")
def spark():
    """The session's SparkSession (local-cluster with two executors)."""
    session = build_spark()
    yield session
    session.stop()


@pytest.fixture(scope="session")
def sc(spark):
    return spark.sparkContext


@pytest.fixture(scope="module")
def converter(request, spark, tmp_path_factory):
    """The converter of the requesting module's rows, ``converter_frame(spark)``, cached in
    small row groups (about 100 rows each) and deleted after the module."""
    df = request.module.converter_frame(spark)
    with small_groups_converter(df, tmp_path_factory.mktemp("converter-cache")) as made:
        yield made


@pytest.fixture(scope="session")
def cancer():
    """scikit-learn's breast cancer data, (X, y): 569 rows, 30 features, 2 classes."""
    from sklearn.datasets import load_breast_cancer

    return load_breast_cancer(return_X_y=True)
