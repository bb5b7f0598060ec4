"""`sparkdist doctor`: is everything sparkdist needs here, and how to fix what is not."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import shutil
import subprocess
from dataclasses import dataclass


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


SYSTEM_FIX = "bash init_scripts/install_system.sh"
HOROVOD_FIX = "bash init_scripts/install_horovod.sh"


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"error: {exc}"
    return (done.stdout + done.stderr).strip()


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_java() -> Check:
    java = shutil.which("java")
    if java is None:
        return Check("Java", False, "no java on PATH", SYSTEM_FIX)
    first = _run([java, "-version"]).splitlines()[:1]
    return Check("Java", True, first[0] if first else java)


def check_spark() -> Check:
    version = _version("pyspark")
    if version is None:
        return Check("Spark (pyspark)", False, "pyspark is not installed", "pip install pyspark")
    return Check("Spark (pyspark)", True, f"pyspark {version}")


def check_mpi() -> Check:
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        return Check(
            "Open MPI",
            False,
            "no mpirun on PATH (the direct launcher still works)",
            SYSTEM_FIX,
            required=False,
        )
    first = _run([mpirun, "--version"]).splitlines()[:1]
    orted = shutil.which("orted")
    if orted is None:
        return Check("Open MPI", False, "mpirun found but no orted", SYSTEM_FIX, required=False)
    return Check("Open MPI", True, first[0] if first else mpirun, required=False)


def check_horovod() -> Check:
    version = _version("horovod")
    if version is None:
        return Check("Horovod", False, "not installed", HOROVOD_FIX, required=False)
    runner = shutil.which("horovodrun")
    out = _run([runner, "--check-build"]) if runner else ""
    frameworks = re.findall(r"\[X\] (\w+)", out)
    if "PyTorch" not in frameworks:
        return Check(
            "Horovod",
            False,
            f"horovod {version} without a working PyTorch binding",
            HOROVOD_FIX,
            required=False,
        )
    return Check("Horovod", True, f"horovod {version}: {', '.join(frameworks)}", required=False)


def check_framework(dist: str, label: str, module: str) -> Check:
    version = _version(dist)
    if version is None:
        return Check(label, False, "not installed", f"pip install {dist}", required=False)
    return Check(label, True, f"{module} {version}", required=False)


def check_gpus() -> Check:
    smi = shutil.which("nvidia-smi")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if smi is None:
        return Check("GPUs", True, "none (no nvidia-smi): ranks train on the CPU", required=False)
    listing = _run([smi, "--query-gpu=index,name", "--format=csv,noheader"])
    detail = "; ".join(listing.splitlines()) or "nvidia-smi lists none"
    if visible is not None:
        detail += f" (CUDA_VISIBLE_DEVICES={visible})"
    return Check(
        "GPUs",
        True,
        detail + " - give Spark conf/gpu_discovery.sh as discovery script",
        required=False,
    )


def run_checks() -> list[Check]:
    return [
        check_java(),
        check_spark(),
        check_mpi(),
        check_horovod(),
        check_framework("torch", "PyTorch", "torch"),
        check_framework("tensorflow-cpu", "TensorFlow", "tensorflow")
        if _version("tensorflow-cpu")
        else check_framework("tensorflow", "TensorFlow", "tensorflow"),
        check_gpus(),
    ]


def report(checks: list[Check]) -> tuple[str, bool]:
    """The printed report, and whether every required piece is there."""
    lines = []
    for check in checks:
        mark = "ok" if check.ok else ("MISSING" if check.required else "missing")
        lines.append(f"{check.name:<16} {mark:<8} {check.detail}")
        if not check.ok and check.fix:
            lines.append(f"{'':<16} {'':<8} fix: {check.fix}")
    healthy = all(c.ok for c in checks if c.required)
    lines.append("")
    lines.append(
        "sparkdist can run here."
        if healthy
        else "sparkdist cannot run here yet: fix the MISSING lines."
    )
    return "\n".join(lines), healthy
