"""Shared fixtures: one real Spark for the whole test session.

`local-cluster[2,1,1024]` starts two real executor JVMs (each with its own Python
workers), so barrier stages behave as on a multi-host cluster. Everything listens on
127.0.0.1. The fixtures that the compatibility suite (tests/compat/conftest.py) shares are
defined once in helpers.py: `spark`, `sc`, `converter`, `cancer`, `cancer_df`.
"""

from __future__ import annotations

import logging
import os
import sys

import module_order
import pytest
from helpers import (  # noqa: F401 - fixtures
    cancer,
    cancer_df,
    converter,
    spark_fixtures,
    use_test_jvm_options,
)
from mlflow_fixture import driver_mlflow, embedded_mlflow, mlflow_server  # noqa: F401 - fixtures

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# py-spy's native stacks cost a stack dump 0.1-3 s (more under load, with torch): only the
# tests of them turn it on (tests/runner/test_stacks.py, `SPARKDIST_PY_SPY=""` in the job's
# env).
os.environ.setdefault("SPARKDIST_PY_SPY", "off")
use_test_jvm_options()

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


# The session's SparkSession (local-cluster with two executors) and its SparkContext.
spark, sc = spark_fixtures()


def pytest_addoption(parser):
    parser.addoption(
        "--store-durations",
        action="store_true",
        help="write each module's seconds to tests/module_durations.json (module_order.py)",
    )


def pytest_configure(config):
    if config.getoption("store_durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(module_order.ModuleDurations(), "module-durations")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`make test` runs the suite on two pytest-xdist workers, a module at a time on one
    worker, the longest modules first (module_order.py). The multi-host tests
    (tests/cluster/) run after, alone: they time network cuts and lost hosts against
    Spark's own detection, which another worker's load shifts (a network cut was once
    blamed on a rank that Spark's cancelling ended)."""
    return module_order.scheduler(config, log)
