"""A Spark Connect session as the runner's `SparkSide`: no SparkContext in this process.

The barrier stage is a DataFrame with one row per rank mapped with
`mapInArrow(..., barrier=True)` (where `BarrierTaskContext` works as in an RDD barrier
stage); it is tagged with `SparkSession.addTag` so `interruptTag` cancels it from any
thread. Slots are judged from the server's configuration, the only thing a Connect
client can read about the cluster.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from functools import partial

from sparkdist.network import resolve
from sparkdist.runner.errors import SparkdistError
from sparkdist.runner.spark_cluster import BarrierTask, check_slot_bound

logger = logging.getLogger(__name__)

STAGE_SCHEMA = "outcome binary"
PROBE_SCHEMA = "reachable boolean"

# Whether executors reach this client, per (server host, client address): probed
# once, since a probe is a Spark job of its own.
_REACHABLE: dict[tuple[str, str], bool] = {}
RELAY_ENV = "SPARKDIST_CONNECT_RELAY"
"""auto (probe once per session), always (relay mode, no probe), never (no probe)."""
RELAY_CHOICES = ("auto", "always", "never")


def route_address(remote_host: str) -> str:
    """This machine's address on the route to `remote_host` (no packet is sent): the
    address at which the cluster behind it can reach this client, if it can at all."""
    target = resolve(remote_host)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((target, 9))
        return sock.getsockname()[0]


def _arrow_task(task: BarrierTask, batches: Iterator) -> Iterator:
    """One barrier task. It reads its input to the end first: pyspark does not reuse a
    Python worker that left input unread, and a fresh one costs the next job most of a
    second (fork, imports)."""
    import pyarrow as pa

    for _ in batches:
        pass
    for value in task(iter(())):
        yield pa.RecordBatch.from_pydict({"outcome": pa.array([value], pa.binary())})


def _arrow_probe(host: str, port: int, batches: Iterator) -> Iterator:
    import pyarrow as pa

    from sparkdist.runner.relay import reachable

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"reachable": [reachable(host, port)]})


class ConnectSpark:
    """A Spark Connect session (Databricks Connect, `sc://` URLs, pyspark-client)."""

    kind = "connect"

    def __init__(self, session):
        self.session = session

    def _conf(self, key: str, default: str | None = None) -> str | None:
        try:
            value = self.session.conf.get(key, default)
        except Exception:  # noqa: BLE001 - a key the server does not expose
            return default
        return default if value is None else value

    def check_slots(self, np: int, ranks_per_task: int, timeout_s: float) -> None:
        check_slot_bound(np, self._conf("spark.master", "") or "", self._conf, ranks_per_task)

    def driver_addresses(self) -> tuple[str, str]:
        address = route_address(self.session.client.host)
        return address, address

    def executors_reach_client(self) -> bool:
        """Probe once per session: a one-task Spark job connects to a listener here
        (unless SPARKDIST_CONNECT_RELAY says always or never)."""
        choice = os.environ.get(RELAY_ENV, "auto")
        if choice not in RELAY_CHOICES:
            raise SparkdistError(f"{RELAY_ENV} must be one of {RELAY_CHOICES}, not {choice!r}")
        if choice != "auto":
            return choice == "never"
        host = self.driver_addresses()[0]
        key = (self.session.client.host, host)
        if key not in _REACHABLE:
            with socket.socket() as listener:
                listener.bind((host, 0))
                listener.listen(8)
                probe = partial(_arrow_probe, host, listener.getsockname()[1])
                rows = self.session.range(0, 1, 1, 1).mapInArrow(probe, PROBE_SCHEMA).collect()
            _REACHABLE[key] = bool(rows and rows[0].reachable)
            logger.info("executors %s this client at %s", "reach" if _REACHABLE[key] else
                        "cannot reach", host)  # fmt: skip
        return _REACHABLE[key]

    def run_barrier_stage(self, num_tasks: int, task: BarrierTask, tag: str) -> list[bytes]:
        # Tags belong to the thread that adds them: this thread runs only this stage.
        self.session.addTag(tag)
        try:
            frame = self.session.range(0, num_tasks, 1, num_tasks)
            stage = frame.mapInArrow(partial(_arrow_task, task), STAGE_SCHEMA, barrier=True)
            return [row.outcome for row in stage.collect()]
        finally:
            self.session.removeTag(tag)

    def cancel(self, tag: str) -> None:
        interrupted = self.session.interruptTag(tag)
        logger.info("interrupted Spark Connect operations tagged %s: %s", tag, interrupted)
