"""Fake GPUs for tests: Spark's own trick, a discovery script that reports GPU
addresses on a machine that has none, used by a child Spark (one SparkContext a process).

A module of its own, not conftest.py: tests/cluster has a conftest.py too, and a plain
`from conftest import ...` finds whichever was imported first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=400,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(lines[-1][len("RESULT ") :])
