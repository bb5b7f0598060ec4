"""A Spark driver in a process of its own, which the tests drive over a local socket.

Only one SparkContext can live in a Python process, and the test session already has
its local-cluster one (tests/conftest.py), so each driver of the namespaced cluster is
a separate process: `RemoteDriver` starts it, and asks it to run functions of
`jobs.py` (by name, with plain-data arguments) against its SparkSession. Several
drivers can run at once (two teams on one cluster), and one can be killed (a driver
that dies).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import traceback
from concurrent.futures import Future
from multiprocessing.connection import Client, Listener
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
KEY_ENV = "SPARKDIST_TEST_DRIVER_KEY"


class DriverGone(RuntimeError):
    """The driver process ended before answering."""


class RemoteDriver:
    """The test side: start the driver process, submit calls, stop or kill it."""

    def __init__(self, cluster, name: str, cores: int = 3, start_timeout_s: float = 180.0):
        self.name = name
        self.log_path = cluster.dir / f"driver-{name}.log"
        key = os.urandom(32)
        address = str(cluster.dir / f"driver-{name}.sock")
        if os.path.exists(address):
            os.unlink(address)
        listener = Listener(address=address, family="AF_UNIX", authkey=key)
        env = dict(os.environ)
        env.update(
            {
                KEY_ENV: key.hex(),  # in the environment, never on the command line
                "SPARK_LOCAL_IP": cluster.driver_address,
                "PYSPARK_PYTHON": sys.executable,
                "PYSPARK_DRIVER_PYTHON": sys.executable,
                "PYTHONPATH": os.pathsep.join([str(HERE), *filter(None, [env.get("PYTHONPATH")])]),
            }
        )
        argv = [
            sys.executable,
            str(HERE / "remote_driver.py"),
            address,
            cluster.master_url,
            cluster.driver_address,
            name,
            str(cores),
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        accepted: list = []
        accepter = threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True)
        accepter.start()
        accepter.join(timeout=30)
        listener.close()
        if not accepted:
            self.kill()
            raise RuntimeError(f"driver {name} did not connect; see {self.log_path}")
        self.conn = accepted[0]
        self._ids = itertools.count()
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._ready: Future = Future()
        threading.Thread(target=self._read, daemon=True).start()
        try:
            self._ready.result(timeout=start_timeout_s)
        except BaseException:
            self.kill()
            raise

    def _read(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                break
            if message[0] == "ready":
                self._ready.set_result(True)
                continue
            call_id, status, value = message
            with self._lock:
                future = self._pending.pop(call_id)
            if status == "ok":
                future.set_result(value)
            else:
                future.set_exception(DriverGone(f"driver {self.name}: {value}"))
        gone = DriverGone(f"driver {self.name} exited; see {self.log_path}")
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        for future in [*pending, self._ready]:
            if not future.done():
                future.set_exception(gone)

    def submit(self, function: str, **kwargs: Any) -> Future:
        """Run `jobs.<function>(spark, **kwargs)` in the driver; its return value arrives
        in the future."""
        future: Future = Future()
        with self._lock:
            call_id = next(self._ids)
            self._pending[call_id] = future
            self.conn.send((call_id, function, kwargs))
        return future

    def call(self, function: str, timeout: float = 300.0, **kwargs: Any) -> Any:
        return self.submit(function, **kwargs).result(timeout=timeout)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL the driver process (its JVM follows when its stdin closes)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.conn.send(None)
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        self.conn.close()


# --- the driver process --------------------------------------------------------------


def serve(address: str, master: str, driver_host: str, name: str, cores: int) -> None:
    conn = Client(address, family="AF_UNIX", authkey=bytes.fromhex(os.environ.pop(KEY_ENV)))
    import logging

    import jobs
    from pyspark.sql import SparkSession

    logging.basicConfig(level=logging.INFO, format=f"[driver {name}] %(name)s: %(message)s")
    # Every failure a job notices, in order: what a fault test's error is chosen from.
    logging.getLogger("sparkdist.runner.driver.failures").setLevel(logging.DEBUG)
    spark = (
        SparkSession.builder.master(master)
        .appName(f"sparkdist-cluster-{name}")
        .config("spark.driver.host", driver_host)
        .config("spark.driver.bindAddress", driver_host)
        .config("spark.driver.memory", "512m")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", str(cores))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executor.heartbeatInterval", "2s")
        .config("spark.network.timeout", "20s")
        .config("spark.network.timeoutInterval", "5s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    send_lock = threading.Lock()

    def reply(message) -> None:
        with send_lock:
            conn.send(message)

    def run(call_id: int, function: str, kwargs: dict) -> None:
        try:
            reply((call_id, "ok", getattr(jobs, function)(spark, **kwargs)))
        except BaseException:  # noqa: BLE001 - reported to the test
            reply((call_id, "error", traceback.format_exc()))

    reply(("ready",))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            break
        if message is None:
            break
        threading.Thread(target=run, args=message, daemon=True).start()
    spark.stop()


if __name__ == "__main__":
    serve(*sys.argv[1:5], int(sys.argv[5]))
