"""The compatibility suite: the paths whose behaviour depends on the stack under them.

`make compat` runs this directory once in each runtime's environment (`.venv-<runtime>`,
built from requirements/runtimes/<runtime>.txt: that runtime's Spark, Python, numpy, pandas,
pyarrow, cloudpickle, scikit-learn and MLflow), with `--confcutdir=tests/compat`, so the main
conftest (whose MLflow server fixtures need the main environment's packages) does not load
here; the fixtures both suites share are defined once in tests/helpers.py. Everything
else runs on the main stack only (tests/); docs/getting-started.md says what runs where, and why.

One SparkSession (local-cluster[2,1,1024]: two executor JVMs) serves the whole run: each
start costs about 30 s, and the suite must stay within a few minutes per runtime.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

ROOT = Path(__file__).resolve().parents[2]
# The tests' shared helpers and fixtures (tests/helpers.py, which imports at its top only what
# every runtime has); the main conftest (mlflow's server, the main stack's packages) stays out
# of this run.
sys.path.insert(0, str(ROOT / "tests"))
from helpers import (  # noqa: E402, F401 - fixtures
    cancer,
    cancer_df,
    converter,
    spark_fixtures,
    use_test_jvm_options,
)

use_test_jvm_options()

RUNTIME = os.environ.get("SPARKDIST_RUNTIME", "")
RUNTIME_FILE = ROOT / "requirements" / "runtimes" / f"{RUNTIME}.txt"
if not RUNTIME_FILE.is_file():
    raise pytest.UsageError(
        f"tests/compat runs on a runtime's stack: `make compat-<runtime>` (runtimes: "
        f"{sorted(p.stem for p in RUNTIME_FILE.parent.glob('*.txt'))}); "
        f"SPARKDIST_RUNTIME={RUNTIME!r} names none"
    )


def runtime_requirements() -> dict[str, str]:
    """{package: pinned version} of the runtime under test ('' where "latest" pins none)."""
    pins = {}
    for line in RUNTIME_FILE.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:==(\S+))?", line).groups()
            pins[name.lower()] = version or ""
    return pins


def runtime_python() -> str:
    """The runtime's Python, X.Y, from its file's `# python: X.Y` line."""
    return re.search(r"^# python: (\S+)$", RUNTIME_FILE.read_text(), re.M).group(1)


# torch installs only where its CPU wheel does (Python 3.11: dbr-15.4 and latest); the
# runtime's file says whether torch is part of its stack, and the torch tests run exactly there.
collect_ignore = [] if "torch" in runtime_requirements() else ["test_compat_torch.py"]


# Local-cluster whatever master the main suite is pointed at (SPARKDIST_TEST_MASTER).
spark, sc = spark_fixtures(master="local-cluster[2,1,1024]", app_name="sparkdist-compat")
