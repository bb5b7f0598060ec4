"""Spark's decommission notices: which of a job's tasks run on an executor that Spark is
decommissioning (a spot instance about to be taken back, a Kubernetes pod deleted, a YARN
node drained), learned while the task still runs.

Spark turns a cloud's notice into executor decommissioning (`spark.decommission.enabled`):
a standalone worker gets SIGPWR, Kubernetes runs `decom.sh` in the executor's pod, YARN
drains a node gracefully. The driver's scheduler then records the executor as
decommissioning (`TaskSchedulerImpl.getExecutorDecommissionState`, Spark 3.1 and later)
and offers it no new task; its running tasks go on until the host dies. pyspark has no
Python API for that state, and Spark posts no listener event or REST field for it (the
status store's executors show only a removal, once the executor is gone). So:

* **classic session**: the driver's JVM is in this process: each poll asks the scheduler,
  through py4j, for the executor of each of the job's task attempts (`taskIdToExecutorId`)
  and whether that executor is decommissioning (`getExecutorDecommissionState`): a few
  py4j calls per task, well under a millisecond each. Checked with Spark 3.5 and 4.x, whose
  scheduler has the same methods.
* **Spark Connect**: nothing to ask. The state lives in the Connect server's scheduler,
  which no Connect RPC, listener event or REST endpoint exposes, and an executor's Python
  worker never sees the signal (it goes to the executor's or the worker's JVM). A job run
  from a Connect client learns of a decommissioned host only when the host is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

ENABLED = "spark.decommission.enabled"


@dataclass(frozen=True)
class Notice:
    """An executor Spark is decommissioning."""

    executor_id: str
    host: str
    since_ms: int
    """When the driver got the notice (ms since the epoch)."""

    def describe(self) -> str:
        return f"executor {self.executor_id} on host {self.host}"


class ClassicDecommissions:
    """The decommission state of a classic session's executors, from its driver's JVM."""

    def __init__(self, sc: Any):
        self._sc = sc
        self._scheduler = sc._jsc.sc().taskScheduler()
        self._executor_of: dict[int, str] = {}
        """Spark task attempt id -> its executor (fixed for the attempt's life)."""

    def enabled(self) -> bool:
        """Whether this application takes decommission notices (`spark.decommission.enabled`)."""
        return self._sc.getConf().get(ENABLED, "false").strip().lower() == "true"

    def local(self) -> bool:
        """Whether the executors run on this machine (`local`, `local-cluster`)."""
        return str(self._sc.master).startswith("local")

    def leaving(self, task_ids: Iterable[int]) -> dict[int, Notice]:
        """The tasks (by Spark task attempt id) whose executor is being decommissioned,
        with its notice. A task Spark no longer runs, or a failed call, is left out
        (asked again at the next poll)."""
        found: dict[int, Notice] = {}
        for task_id in task_ids:
            try:
                notice = self._notice(task_id)
            except Exception as exc:  # noqa: BLE001 - py4j errors: the next poll asks again
                logger.debug("decommission state of task %d: %s", task_id, exc)
                continue
            if notice is not None:
                found[task_id] = notice
        return found

    def is_leaving(self, task_id: int) -> bool:
        """Whether task attempt `task_id` runs on an executor being decommissioned."""
        return task_id >= 0 and bool(self.leaving([task_id]))

    def _notice(self, task_id: int) -> Notice | None:
        executor = self._executor_of.get(task_id)
        if executor is None:
            found = self._scheduler.taskIdToExecutorId().get(task_id)
            if not found.isDefined():
                return None
            executor = self._executor_of[task_id] = str(found.get())
        state = self._scheduler.getExecutorDecommissionState(executor)
        if not state.isDefined():
            return None
        state = state.get()
        worker_host = state.workerHost()
        if worker_host.isDefined():
            host = str(worker_host.get())
        else:
            known = self._scheduler.executorIdToHost().get(executor)
            host = str(known.get()) if known.isDefined() else "?"
        return Notice(executor, host, int(state.startTime()))


def for_session(cluster: Any) -> ClassicDecommissions | None:
    """Where the job learns of decommissioning executors: a classic session's driver
    JVM; None for Spark Connect (see the module) or a driver-local job."""
    sc = getattr(cluster, "sc", None)
    if sc is None:
        return None
    try:
        return ClassicDecommissions(sc)
    except Exception as exc:  # noqa: BLE001 - a scheduler without the state: no notices
        logger.info("no decommission notices from this session: %s", exc)
        return None


def setup_warning(cluster: Any, elastic: bool) -> str | None:
    """What is wrong with how this session takes decommission notices, for a job that
    could use them (None: nothing to say)."""
    source = for_session(cluster)
    if source is None:
        kind = getattr(cluster, "kind", "")
        if kind == "connect" and elastic:
            return (
                "this Spark Connect session exposes no executor decommission notices: an "
                "elastic job leaves a decommissioned host only once the host is lost (run "
                "it from a classic session to leave it at the notice, with nothing lost)"
            )
        return None
    if source.local():
        return None  # no host of a local master is ever taken back
    if elastic and not source.enabled():
        return (
            f"{ENABLED} is not set on this application: when a host is taken back (spot "
            "capacity, a drained node) this elastic job loses its ranks there and resumes "
            f"from its last checkpoint, instead of leaving it at the notice with nothing "
            f"lost. Set {ENABLED}=true on the application and on the cluster (standalone "
            "workers: SPARK_WORKER_OPTS=-Dspark.decommission.enabled=true; see "
            "docs/elastic.md)"
        )
    return None
