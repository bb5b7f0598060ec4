"""`sparkdist doctor`: what is missing, and the command that fixes it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from installed import requires

from sparkdist.doctor import check_gpus, check_java, java_major, parse_check_build, report

VENV_BIN = Path(sys.executable).parent


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env['PATH']}"
    env.update(extra)
    return env


def _doctor(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [VENV_BIN / "sparkdist", "doctor"], env=env, capture_output=True, text=True, timeout=120
    )


def _line(output: str, name: str) -> tuple[str, str]:
    """The check's line and the line after it (its fix, if any)."""
    lines = output.splitlines() + [""]
    i = next(i for i, line in enumerate(lines) if line.startswith(name))
    return lines[i], lines[i + 1]


def _bin_with_java(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    java = subprocess.run(["which", "java"], capture_output=True, text=True).stdout.strip()
    (bin_dir / "java").symlink_to(os.path.realpath(java))
    return bin_dir


def test_doctor_names_whats_missing_and_the_fix(tmp_path):
    bin_dir = _bin_with_java(tmp_path)
    done = _doctor(_env(PATH=f"{bin_dir}{os.pathsep}{VENV_BIN}"))
    java, _ = _line(done.stdout, "Java")
    assert " ok " in java
    mpi, fix = _line(done.stdout, "Open MPI")
    assert "missing" in mpi
    assert "fix: bash init_scripts/install_system.sh" in fix
    assert done.returncode == 0  # MPI is optional: the direct launcher works without it


@requires("horovod", "run `make horovod` (init_scripts/install_horovod.sh)")
def test_doctor_healthy_here_lists_horovod_frameworks_and_controllers():
    done = _doctor(_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Open MPI         ok" in done.stdout
    assert "sparkdist can run here." in done.stdout
    horovod, _ = _line(done.stdout, "Horovod")
    assert " ok " in horovod
    assert "frameworks PyTorch;" in horovod
    assert "controllers MPI, Gloo" in horovod


def _fake_command(bin_dir: Path, name: str, script: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def test_java_too_old_for_spark_is_missing_with_the_fix(tmp_path, monkeypatch):
    _fake_command(tmp_path, "java", "echo 'openjdk version \"11.0.22\" 2024-01-16' >&2\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    check = check_java()
    assert not check.ok and check.required
    assert "needs Java 17 or later" in check.detail and "openjdk-17" in check.fix
    text, healthy = report([check])
    assert not healthy and "fix the MISSING lines" in text


def test_gpus_without_spark_resources_say_which_keys(tmp_path, monkeypatch):
    """A machine with GPUs (a fake nvidia-smi: there is no GPU here) whose Spark conf
    does not schedule them, then one whose conf does."""
    _fake_command(tmp_path / "bin", "nvidia-smi", "echo '0, Fake GPU'\necho '1, Fake GPU'\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    (tmp_path / "spark-defaults.conf").write_text("spark.task.cpus 1\n")
    check = check_gpus()
    assert not check.ok and "0, Fake GPU; 1, Fake GPU" in check.detail
    assert "spark.task.resource.gpu.amount" in check.fix and "gpu_discovery.sh" in check.fix

    (tmp_path / "spark-defaults.conf").write_text(
        "spark.executor.resource.gpu.amount 2\nspark.task.resource.gpu.amount 1\n"
    )
    check = check_gpus()
    assert check.ok and "spark.task.resource.gpu.amount=1" in check.detail


@pytest.mark.parametrize(
    "output, major",
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('java version "1.8.0_402"', 8),
        ('openjdk version "21" 2023-09-19', 21),
        ("no version here", None),
    ],
)
def test_java_major(output, major):
    assert java_major(output) == major


def test_parse_check_build():
    output = """Horovod v0.28.1:

Available Frameworks:
    [ ] TensorFlow
    [X] PyTorch
    [ ] MXNet

Available Controllers:
    [X] MPI
    [X] Gloo

Available Tensor Operations:
    [ ] NCCL
    [X] Gloo
"""
    assert parse_check_build(output) == {
        "Frameworks": ["PyTorch"],
        "Controllers": ["MPI", "Gloo"],
        "Operations": ["Gloo"],
    }
