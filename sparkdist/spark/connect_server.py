"""A Spark Connect server on this machine, for trying Connect, tests and benchmarks.

pyspark's wheel carries the server (`org.apache.spark.sql.connect.service.
SparkConnectServer`); this starts it with `spark-submit` over an embedded
`local-cluster` (real executor JVMs), waits until it accepts connections, and stops
it by the process group it started. The server dies with the thread that started it
(a parent-death signal), so a starter that is killed leaves no server behind:

    with LocalConnectServer() as server:
        spark = SparkSession.builder.remote(server.url).getOrCreate()
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from sparkdist.protocol.processes import popen_group

logger = logging.getLogger(__name__)

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _spark_home() -> str:
    import pyspark

    return os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)


class LocalConnectServer:
    """A Spark Connect server over `local-cluster[executors,1,1024]` on `host`."""

    def __init__(
        self,
        executors: int = 2,
        *,
        master: str | None = None,
        host: str = "127.0.0.1",
        conf: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        log_path: str | os.PathLike | None = None,
        start_timeout_s: float = 180.0,
    ):
        self.host = host
        self.port = _free_port(host)
        self.master = master or f"local-cluster[{executors},1,1024]"
        self.conf = {
            "spark.connect.grpc.binding.address": host,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": host,
            "spark.driver.bindAddress": host,
            "spark.ui.enabled": "false",
            "spark.executor.memory": "1g",
            "spark.sql.shuffle.partitions": "4",
            **(conf or {}),
        }
        self.env = dict(env or {})
        self.log_path = Path(log_path) if log_path else None
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"sc://{self.host}:{self.port}"

    def start(self) -> LocalConnectServer:
        home = _spark_home()
        argv = [os.path.join(home, "bin", "spark-submit"), "--class", SERVER_CLASS]
        argv += ["--master", self.master]
        for key, value in self.conf.items():
            argv += ["--conf", f"{key}={value}"]
        argv.append("spark-internal")
        env = {
            **os.environ,
            "SPARK_HOME": home,
            "SPARK_LOCAL_IP": self.host,
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
            **self.env,
        }
        env.pop("SPARK_REMOTE", None)
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        # A session of its own, so stop() reaches Spark's executors by the group; tied to
        # this thread, so a starter killed before stop() takes the server with it.
        self.proc = popen_group(argv, env, new_session=True, stdout=log, stderr=subprocess.STDOUT)
        if log is not subprocess.DEVNULL:
            log.close()
        deadline = time.monotonic() + self.start_timeout_s
        while not self._accepts():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the Spark Connect server exited with code {self.proc.returncode} before "
                    f"it listened on {self.url}"
                    + (f"; see {self.log_path}" if self.log_path else "")
                )
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the Spark Connect server did not listen on {self.url}")
            time.sleep(0.2)
        logger.info("Spark Connect server (pid %d) at %s", self.proc.pid, self.url)
        return self

    def _accepts(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1.0):
                return True
        except OSError:
            return False

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the server's process group: SIGTERM (Spark stops its executors), then
        SIGKILL if it has not ended in `timeout_s`."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> LocalConnectServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
