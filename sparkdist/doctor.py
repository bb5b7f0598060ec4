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


MIN_JAVA = 17  # Spark 4 runs on Java 17 or 21


def java_major(version_output: str) -> int | None:
    """The major version in `java -version` output ("17.0.15" -> 17, "1.8.0_402" -> 8)."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def check_java() -> Check:
    java = shutil.which("java")
    if java is None:
        return Check("Java", False, "no java on PATH", SYSTEM_FIX)
    output = _run([java, "-version"])
    first = output.splitlines()[0] if output else java
    major = java_major(output)
    if major is not None and major < MIN_JAVA and _spark_major() >= 4:
        return Check(
            "Java",
            False,
            f"{first}: Spark 4 needs Java {MIN_JAVA} or later",
            f"install openjdk-{MIN_JAVA}-jre-headless and put it first on PATH (or set JAVA_HOME)",
        )
    return Check("Java", True, first)


def _pyspark_version() -> str | None:
    """pyspark's version: from pip's metadata, else from the module itself (Databricks
    runtimes ship pyspark without pip metadata)."""
    version = _version("pyspark")
    if version is None:
        try:
            import pyspark

            version = pyspark.__version__
        except ImportError:
            return None
    return version


def _spark_major() -> int:
    version = _pyspark_version() or "0"
    return int(version.split(".")[0])


def check_spark() -> Check:
    version = _pyspark_version()
    if version is None:
        return Check("Spark (pyspark)", False, "pyspark is not installed", "pip install pyspark")
    return Check("Spark (pyspark)", True, f"pyspark {version}")


def check_connect() -> Check:
    """Whether this Python can be a Spark Connect client (pyspark's own dependency check),
    and, when SPARK_REMOTE names a server, whether a session opens there."""
    name, fix = "Spark Connect", "pip install 'sparkdist[connect]'"
    try:
        from pyspark.sql.connect.utils import check_dependencies

        try:
            check_dependencies()
        except TypeError:  # pyspark 3.5 takes the calling module's name
            check_dependencies("pyspark.sql.connect")
    except Exception as exc:  # noqa: BLE001 - pyspark's ImportError names the package
        return Check(name, False, f"no client: {exc}", fix, required=False)
    remote = os.environ.get("SPARK_REMOTE")
    if not remote:
        return Check(
            name,
            True,
            "client packages present (set SPARK_REMOTE to check a server)",
            required=False,
        )
    version, problem = _open_connect(remote)
    if problem:
        return Check(
            name,
            False,
            f"cannot open a session at {remote}: {problem}",
            "check SPARK_REMOTE and that the server runs",
            required=False,
        )
    return Check(name, True, f"session at {remote} open (Spark {version})", required=False)


def _open_connect(remote: str, timeout_s: float = 30.0) -> tuple[str | None, str | None]:
    """(the server's Spark version, None) or (None, why no session opens at `remote`).
    Bounded: pyspark's client retries an unreachable server for minutes."""
    import socket
    import threading
    from urllib.parse import urlparse

    parsed = urlparse(remote)
    host, port = parsed.hostname or "localhost", parsed.port or 15002
    try:
        socket.create_connection((host, port), timeout=5.0).close()
    except OSError as exc:
        return None, f"nothing accepts connections at {host}:{port} ({exc.strerror or exc})"
    answer: list[tuple[str | None, str | None]] = []

    def probe() -> None:
        try:
            from pyspark.sql import SparkSession

            answer.append((SparkSession.builder.remote(remote).getOrCreate().version, None))
        except Exception as exc:  # noqa: BLE001
            text = str(exc).strip()
            answer.append((None, text.splitlines()[0][:200] if text else type(exc).__name__))

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return answer[0] if answer else (None, f"no answer in {timeout_s:.0f}s")


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
    build = parse_check_build(_run([runner, "--check-build"]) if runner else "")
    frameworks = build.get("Frameworks", [])
    controllers = build.get("Controllers", [])
    detail = (
        f"horovod {version}: frameworks {', '.join(frameworks) or 'none'}; "
        f"controllers {', '.join(controllers) or 'none'}"
    )
    if "PyTorch" not in frameworks or not controllers:
        return Check(
            "Horovod",
            False,
            detail + " (needs PyTorch and MPI or Gloo)",
            HOROVOD_FIX,
            required=False,
        )
    return Check("Horovod", True, detail, required=False)


def parse_check_build(output: str) -> dict[str, list[str]]:
    """`horovodrun --check-build` as {"Frameworks": [...], "Controllers": [...], ...},
    listing what is built in ([X]) under each "Available ...:" heading."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in output.splitlines():
        heading = re.match(r"\s*Available (.+?):\s*$", line)
        if heading:
            current = sections.setdefault(heading.group(1).replace("Tensor ", ""), [])
            continue
        item = re.match(r"\s*\[X\]\s+(\S+)", line)
        if item and current is not None:
            current.append(item.group(1))
    return sections


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
    spark_gpu = _spark_gpu_conf()
    listing = _run([smi, "--query-gpu=index,name", "--format=csv,noheader"])
    detail = "; ".join(listing.splitlines()) or "nvidia-smi lists none"
    if visible is not None:
        detail += f" (CUDA_VISIBLE_DEVICES={visible})"
    if not spark_gpu:
        return Check(
            "GPUs",
            False,
            detail + "; but no Spark GPU resources are configured, so ranks would share them",
            "set spark.executor.resource.gpu.amount, spark.task.resource.gpu.amount and "
            "spark.executor.resource.gpu.discoveryScript=conf/gpu_discovery.sh "
            "(see conf/spark-defaults.conf)",
            required=False,
        )
    return Check("GPUs", True, f"{detail}; Spark: {spark_gpu}", required=False)


def _spark_gpu_conf() -> str:
    """The GPU resource settings of the active SparkSession, else of spark-defaults.conf
    under SPARK_CONF_DIR (what a `spark-submit` here would use)."""
    keys = ("spark.executor.resource.gpu.amount", "spark.task.resource.gpu.amount")
    found: dict[str, str] = {}
    try:
        from pyspark import SparkContext

        active = SparkContext._active_spark_context
        if active is not None:
            found = {k: active.getConf().get(k) for k in keys if active.getConf().contains(k)}
    except ImportError:
        pass
    conf_dir = os.environ.get("SPARK_CONF_DIR")
    if not found and conf_dir and os.path.exists(os.path.join(conf_dir, "spark-defaults.conf")):
        with open(os.path.join(conf_dir, "spark-defaults.conf"), encoding="utf-8") as f:
            for line in f:
                parts = line.split(None, 1)
                if len(parts) == 2 and parts[0] in keys:
                    found[parts[0]] = parts[1].strip()
    return ", ".join(f"{k}={v}" for k, v in found.items())


def check_warm_worlds() -> Check:
    """Warm worlds (`keep_warm`) hold cluster slots while idle: say whose, on this machine."""
    from sparkdist.runner.driver.warm import listed

    worlds = listed()
    if not worlds:
        return Check("Warm worlds", True, "none kept on this machine", required=False)
    held = "; ".join(
        f"driver pid {w['pid']}: np={w['np']}, {w['launcher']}, keep_warm={w['keep_warm']:g}s"
        for w in worlds
    )
    return Check("Warm worlds", True, f"{len(worlds)} kept ({held})", required=False)


def run_checks() -> list[Check]:
    return [
        check_java(),
        check_spark(),
        check_connect(),
        check_mpi(),
        check_horovod(),
        check_framework("torch", "PyTorch", "torch"),
        check_framework("tensorflow-cpu", "TensorFlow", "tensorflow")
        if _version("tensorflow-cpu")
        else check_framework("tensorflow", "TensorFlow", "tensorflow"),
        check_framework("optuna", "Optuna (sparkdist.tune)", "optuna"),
        check_gpus(),
        check_warm_worlds(),
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
