"""A Spark Connect session as a `Cluster`: no SparkContext in this process. Also how a
Connect session is recognised, and the clear error for what needs a SparkContext.

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
from collections.abc import Callable, Iterator
from functools import partial

from sparkdist.errors import SparkdistError
from sparkdist.job_environment import CONNECT_RELAY as RELAY_ENV
from sparkdist.network import resolve
from sparkdist.spark.cluster import BarrierTask, PlainTask, ServicePlace
from sparkdist.spark.jobs import described
from sparkdist.spark.slots import check_barrier_allowed, check_slot_bound, configured_slots

logger = logging.getLogger(__name__)

STAGE_SCHEMA = "outcome binary"
PROBE_TIMEOUT_S = 3.0
PROBE_SCHEMA = "reachable boolean"

# Whether executors reach this client, per (server host, client address): probed
# once, since a probe is a Spark job of its own.
_REACHABLE: dict[tuple[str, str], bool] = {}
RELAY_CHOICES = ("auto", "always", "never")


def reachable(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to (host, port) opens from here within `timeout_s`."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
        return True
    except OSError:
        return False


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


def _arrow_plain_task(task: PlainTask, batches: Iterator) -> Iterator:
    """One plain task: its input rows are the task indexes of its partition."""
    import pyarrow as pa

    indexes = [i for batch in batches for i in batch.column(0).to_pylist()]
    for index in indexes:
        yield pa.RecordBatch.from_pydict({"outcome": pa.array([task(index)], pa.binary())})


def _arrow_probe(host: str, port: int, batches: Iterator) -> Iterator:
    import pyarrow as pa

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

    def slots(self) -> int:
        """The configured slots: a Connect client can read nothing else of the cluster."""
        configured = configured_slots(self._conf("spark.master", "") or "", self._conf)
        if configured is None:
            default = self._conf("spark.default.parallelism")
            configured = int(default) if default else 1
        return configured

    def check_slots(self, np: int, ranks_per_task: int, timeout_s: float) -> None:
        check_barrier_allowed(self._conf)
        check_slot_bound(np, self._conf("spark.master", "") or "", self._conf, ranks_per_task)

    def check_elastic(self, max_np: int, ranks_per_task: int) -> None:
        master = self._conf("spark.master", "") or ""
        check_slot_bound(max_np, master, self._conf, ranks_per_task, "max_np")

    def service_place(self) -> ServicePlace:
        """This client's address on the route to the server; in the stage when the
        executors cannot connect to it."""
        address = route_address(self.session.client.host)
        return ServicePlace(address, address, in_stage=not self._executors_reach(address))

    def _executors_reach(self, address: str) -> bool:
        """Probe once per session: a one-task Spark job connects to a listener here
        (unless SPARKDIST_CONNECT_RELAY says always or never)."""
        choice = os.environ.get(RELAY_ENV, "auto")
        if choice not in RELAY_CHOICES:
            raise SparkdistError(f"{RELAY_ENV} must be one of {RELAY_CHOICES}, not {choice!r}")
        if choice != "auto":
            return choice == "never"
        key = (self.session.client.host, address)
        if key not in _REACHABLE:
            with socket.socket() as listener:
                listener.bind((address, 0))
                listener.listen(8)
                probe = partial(_arrow_probe, address, listener.getsockname()[1])
                rows = self.session.range(0, 1, 1, 1).mapInArrow(probe, PROBE_SCHEMA).collect()
            _REACHABLE[key] = bool(rows and rows[0].reachable)
            logger.info(
                "executors %s this client at %s",
                "reach" if _REACHABLE[key] else "cannot reach",
                address,
            )
        return _REACHABLE[key]

    def run_barrier_stage(
        self,
        num_tasks: int,
        task: BarrierTask,
        tag: str,
        description: str = "",
        announce: Callable[[bytes], None] | None = None,
    ) -> list[bytes]:
        frame = self.session.range(0, num_tasks, 1, num_tasks)
        stage = frame.mapInArrow(partial(_arrow_task, task), STAGE_SCHEMA, barrier=True)
        if announce is None:
            return self._collect_tagged(stage, tag, description)
        # The server streams each partition's rows as soon as it and those before it
        # ended: task 0's row comes while the other tasks still run.
        outputs = []
        with described(self.session, description or f"sparkdist {tag}", group=tag):
            for row in stage.toLocalIterator():
                outputs.append(row.outcome)
                if len(outputs) == 1:
                    announce(row.outcome)
        return outputs

    def run_tasks(
        self, num_tasks: int, task: PlainTask, tag: str, description: str = ""
    ) -> list[bytes]:
        frame = self.session.range(0, num_tasks, 1, num_tasks)
        return self._collect_tagged(
            frame.mapInArrow(partial(_arrow_plain_task, task), STAGE_SCHEMA), tag, description
        )

    def _collect_tagged(self, stage, tag: str, description: str) -> list[bytes]:
        # Tags belong to the thread that adds them: this thread runs only this stage.
        with described(self.session, description or f"sparkdist {tag}", group=tag):
            return [row.outcome for row in stage.collect()]

    def cancel(self, tag: str) -> None:
        interrupted = self.session.interruptTag(tag)
        logger.info("interrupted Spark Connect operations tagged %s: %s", tag, interrupted)
