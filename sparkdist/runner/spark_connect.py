"""A Spark Connect session as the runner's `SparkSide`: no SparkContext in this process.

The barrier stage is a DataFrame with one row per rank mapped with
`mapInArrow(..., barrier=True)` (where `BarrierTaskContext` works as in an RDD barrier
stage); it is tagged with `SparkSession.addTag` so `interruptTag` cancels it from any
thread. Slots are judged from the server's configuration, the only thing a Connect
client can read about the cluster.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

from sparkdist.runner.network import resolve
from sparkdist.runner.spark_cluster import BarrierTask, check_slot_bound

logger = logging.getLogger(__name__)

STAGE_SCHEMA = "task int"


def route_address(remote_host: str) -> str:
    """This machine's address on the route to `remote_host` (no packet is sent): the
    address at which the cluster behind it can reach this client, if it can at all."""
    target = resolve(remote_host)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((target, 9))
        return sock.getsockname()[0]


def _arrow_task(task: BarrierTask, batches: Iterator) -> Iterator:
    import pyarrow as pa

    for index in task(batches):
        yield pa.RecordBatch.from_pydict({"task": pa.array([index], pa.int32())})


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

    def check_slots(self, np: int, timeout_s: float) -> None:
        check_slot_bound(np, self._conf("spark.master", "") or "", self._conf)

    def driver_addresses(self) -> tuple[str, str]:
        address = route_address(self.session.client.host)
        return address, address

    def run_barrier_stage(self, np: int, task: BarrierTask, tag: str) -> None:
        from functools import partial

        # Tags belong to the thread that adds them: this thread runs only this stage.
        self.session.addTag(tag)
        try:
            frame = self.session.range(0, np, 1, np)
            frame.mapInArrow(partial(_arrow_task, task), STAGE_SCHEMA, barrier=True).collect()
        finally:
            self.session.removeTag(tag)

    def cancel(self, tag: str) -> None:
        interrupted = self.session.interruptTag(tag)
        logger.info("interrupted Spark Connect operations tagged %s: %s", tag, interrupted)
