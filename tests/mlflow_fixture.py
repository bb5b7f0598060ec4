"""A real MLflow tracking server for the tests (SQLite backend, on 127.0.0.1).

Fixtures registered through conftest.py: `mlflow_server` (session), `driver_mlflow` and
`embedded_mlflow`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from helpers import free_port

MLFLOW = str(Path(sys.executable).with_name("mlflow"))


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any MLflow settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real tracking server; yields its URI and stops it by the pid it started."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    log = open(root / "server.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            MLFLOW,
            "server",
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--default-artifact-root",
            str(root / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        # No job-runner worker pool (MLflow 3 starts one by default): tracking needs none.
        env=clean_env(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),
        start_new_session=True,  # its own process group: the server and its workers
    )
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(root / 'server.log').read_text()}")
            try:
                if requests.get(f"{uri}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server not up: {(root / 'server.log').read_text()}")
            time.sleep(0.25)  # polling the health endpoint, bounded by the deadline
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.fixture
def driver_mlflow(mlflow_server):
    """mlflow in this process pointed at the server; any run left open is ended."""
    import mlflow

    mlflow.set_tracking_uri(mlflow_server)
    yield mlflow
    while mlflow.active_run() is not None:
        mlflow.end_run()


@pytest.fixture
def embedded_mlflow(tmp_path, monkeypatch):
    """No tracking configured and a fresh working directory, as a user's first run of
    the embedded store (`sparkdist.tracking.use_default_tracking`) sees it; the
    process's tracking URI is restored afterwards."""
    import mlflow
    from mlflow.tracking._tracking_service import utils

    before = mlflow.get_tracking_uri() if utils.is_tracking_uri_set() else None
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    utils._tracking_uri = None
    monkeypatch.chdir(tmp_path)
    yield mlflow
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(before)
