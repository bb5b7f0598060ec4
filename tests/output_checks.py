"""What a clean run of a real command looks like: the checks tests/test_clean_output.py
and tests/cli/test_demo.py apply to a command's whole output (stdout and stderr, up to the
JVM's exit)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

JAVA_FRAME = re.compile(r"^\s+at [\w$.]+\(", re.M)
# absl/glog's format (`I0000 00:00:1795414858.524550   26369 port.cc:153] ...`), TensorFlow's
# own (`2026-11-23 06:20:11.123456: I tensorflow/...cc:42] ...`) and absl's start-up notice.
CPP_LOG = re.compile(
    r"^(\[rank \d+\] )?([IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\]"
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] \S+:\d+\]"
    r"|WARNING: All log messages before absl::InitializeLog)",
    re.M,
)
# Warnings that sparkdist's own use of Keras and MLflow used to raise, and Spark's
# start-up notes when it does not use the project's log4j2 configuration.
NOISE = (
    "`shuffle=True` was passed",
    "Add type hints to the `predict` method",
    "serialized using CloudPickle",
    "Using Spark's default log4j profile",
    "NativeCodeLoader",
    # MLflow's own INFO lines and its download bar when the demo logs the ensemble.
    "Creating initial MLflow database tables",
    "Inferring model signature",
    "Downloading artifacts",
)


def run_command(args: list[str], cwd: Path) -> str:
    env = dict(os.environ)
    for name in ("MLFLOW_TRACKING_URI", "TF_CPP_MIN_LOG_LEVEL", "SPARK_CONF_DIR"):
        env.pop(name, None)
    # capture_output reads until every holder of the pipes is gone: the driver JVM too.
    done = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    return output


def assert_clean(output: str) -> None:
    errors = [line for line in output.splitlines() if "ERROR" in line]
    assert not errors, errors[:10]
    assert not JAVA_FRAME.search(output), JAVA_FRAME.search(output)
    assert not CPP_LOG.search(output), CPP_LOG.search(output)
    assert not [text for text in NOISE if text in output], output[-5000:]
