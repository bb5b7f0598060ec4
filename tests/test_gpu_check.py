"""`make gpu-check` keeps working where there is no GPU (as in CI): the script runs as it
would on the GPU machine, with pyspark and cryptography unimportable (`tests/gpu/gpu_image`
first on PYTHONPATH) and no Java; every CUDA check is reported skipped, the checks that run
on CPU (gloo, CPU tensors, the benchmarks' CPU rows) pass, and the table is written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "gpu"))

import gpu_check  # noqa: E402


@pytest.mark.timeout(500)
def test_gpu_check_runs_without_spark_and_skips_cuda_checks_on_cpu(tmp_path):
    import torch

    table = tmp_path / "gpu-check.txt"
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "SPARK_HOME")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "gpu" / "gpu_image"), str(ROOT)])
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "gpu" / "gpu_check.py"), "--table", str(table)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=480,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = table.read_text()
    cuda = torch.cuda.is_available()
    for check in gpu_check.CHECKS:
        line = next(line for line in text.splitlines() if line.startswith(check.name))
        result = line[len(check.name) :].split()[0]
        if check.cuda and not cuda:
            assert gpu_check.SKIPPED in line, line
        else:
            assert result == "passed", line
    assert "failed" not in text
    assert "installed from wheels: none" in text
