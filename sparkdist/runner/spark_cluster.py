"""The driver's dealings with Spark for a job: checking slots, and submitting,
watching and cancelling the barrier stage that places the ranks.

`BarrierStage` is the same for both kinds of session; what differs (how a barrier
stage is submitted and cancelled, how slots are counted) sits behind `SparkSide`,
with `ClassicSpark` here and `ConnectSpark` in `spark_connect.py`.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import cloudpickle

from sparkdist.network import is_local_address, resolve
from sparkdist.runner.errors import JobTimeoutError, NotEnoughSlotsError, SparkdistError
from sparkdist.runner.job_state import JobState
from sparkdist.runner.launch import LaunchSpec
from sparkdist.runner.processes import ProcessRecord, wait_gone
from sparkdist.runner.spark_task import run_barrier_task

logger = logging.getLogger(__name__)

CANCEL_GRACE_S = 10.0
JOIN_TIMEOUT_S = 60.0


def slots_upper_bound(master: str, task_cpus: int) -> int | None:
    """The most task slots a fixed-size master can ever offer; None if unknown."""
    if master == "local":
        return 1
    match = re.fullmatch(r"local\[(\*|\d+)(?:,\s*\d+)?\]", master)
    if match:
        cores = (os.cpu_count() or 1) if match.group(1) == "*" else int(match.group(1))
        return max(cores // task_cpus, 0)
    match = re.fullmatch(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]", master)
    if match:
        return int(match.group(1)) * (int(match.group(2)) // task_cpus)
    return None


def configured_slots(master: str, conf_get: Callable[..., str | None]) -> int | None:
    """The task slots a fixed-size cluster has once all its executors registered, from
    its configuration alone (right after start-up fewer may have registered); None when
    unknown or when dynamic allocation can grow it."""
    task_cpus = int(conf_get("spark.task.cpus", None) or "1")
    if (conf_get("spark.dynamicAllocation.enabled", None) or "false").lower() == "true":
        return None
    bound = slots_upper_bound(master, task_cpus)
    if bound is None:
        instances = conf_get("spark.executor.instances", None)
        cores = conf_get("spark.executor.cores", None)
        if instances and cores:
            bound = int(instances) * (int(cores) // task_cpus)
    return bound


def session_slots(spark: Any) -> int | None:
    """The task slots of a session's cluster: its configuration's count (works under
    Spark Connect too), else a classic session's default parallelism; None if unknown."""
    conf_get = spark.conf.get
    slots = configured_slots(conf_get("spark.master", None) or "", conf_get)
    if slots is None and hasattr(spark, "_jsc"):
        slots = spark.sparkContext.defaultParallelism
    return slots


def slots_needed(np: int, ranks_per_task: int = 1) -> str:
    """How a slot error states the need, e.g. "np=4 ranks (2 per task) need 2 task slots"."""
    per_task = f" ({ranks_per_task} per task)" if ranks_per_task > 1 else ""
    return f"np={np} ranks{per_task} need {np // ranks_per_task} task slots at once"


def check_slot_bound(
    np: int, master: str, conf_get: Callable[..., str | None], ranks_per_task: int = 1
) -> None:
    """Raise `NotEnoughSlotsError` when a fixed-size cluster can never run the job's
    barrier tasks at once (reading only configuration, so it works on any kind of
    session)."""
    bound = configured_slots(master, conf_get)
    if bound is not None and np // ranks_per_task > bound:
        raise NotEnoughSlotsError(
            f"{slots_needed(np, ranks_per_task)}, but this Spark ({master}, "
            f"spark.task.cpus={conf_get('spark.task.cpus', None) or '1'}) has {bound} task "
            "slots. Lower np, or give the cluster more executors or cores."
        )


BarrierTask = Callable[[Iterator], Iterator[bytes]]
"""One barrier task's part of a job; yields one value (see `spark_task.run_barrier_task`)."""


class SparkSide(Protocol):
    """Everything the runner asks of Spark; one implementation per kind of session."""

    kind: str
    """"classic" (a SparkContext in this process) or "connect" (a Spark Connect client)."""

    def check_slots(self, np: int, ranks_per_task: int, timeout_s: float) -> None:
        """Raise `NotEnoughSlotsError` (with both numbers) rather than hang, when the
        cluster cannot run the job's np // ranks_per_task barrier tasks at once."""

    def driver_addresses(self) -> tuple[str, str]:
        """(address to bind the job's service to, address executors reach it at)."""

    def executors_reach_client(self) -> bool:
        """Whether executors can open connections to this process (else: relay mode)."""

    def run_barrier_stage(self, num_tasks: int, task: BarrierTask, tag: str) -> list[bytes]:
        """Run `task` in `num_tasks` barrier tasks tagged `tag`; block until the stage
        ends and return what each task yielded."""

    def cancel(self, tag: str) -> None:
        """Cancel the Spark jobs tagged `tag` (from any thread)."""


def spark_error_summary(exc: BaseException) -> str:
    """The Python error inside a Py4J/Spark error, instead of a Java stack."""
    python = python_error_in(exc)
    if python is not None:
        return python
    text = str(exc)
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first[:300]


def python_error_in(exc: BaseException) -> str | None:
    """The last Python exception line a Spark task raised, quoted in a Spark error."""
    found = re.findall(r"^\s*(\w+(?:Error|Exception): .+)$", str(exc), re.M)
    python = [line for line in found if not line.startswith(("org.", "java.", "py4j"))]
    return python[-1].strip() if python else None


class ClassicSpark:
    """A classic session: the SparkContext lives in this process (see `spark_side`)."""

    kind = "classic"

    def __init__(self, sc):
        self.sc = sc

    def _slots(self) -> int:
        jsc = self.sc._jsc.sc()
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))

    def check_slots(self, np: int, ranks_per_task: int, timeout_s: float) -> None:
        """Fail now, with both numbers, if the cluster cannot run the job's tasks at once.

        Executors may still be registering right after start-up, so wait for them up
        to `timeout_s` when the cluster could grow to enough slots.
        """
        conf = self.sc.getConf()
        check_slot_bound(np, self.sc.master, conf.get, ranks_per_task)
        deadline = time.monotonic() + timeout_s
        slots = self._slots()
        while slots < np // ranks_per_task:
            if time.monotonic() > deadline:
                raise NotEnoughSlotsError(
                    f"{slots_needed(np, ranks_per_task)}, but the cluster has {slots} task "
                    f"slots (waited {timeout_s:.0f}s for executors). Lower np, or add "
                    "executors or cores."
                )
            time.sleep(0.2)
            slots = self._slots()

    def driver_addresses(self) -> tuple[str, str]:
        """(address to bind the driver's server to, address executors reach it at)."""
        conf = self.sc.getConf()
        advertise = resolve(conf.get("spark.driver.host", "127.0.0.1"))
        bind = conf.get("spark.driver.bindAddress", None) or advertise
        return resolve(bind), advertise

    def executors_reach_client(self) -> bool:
        return True  # the driver's own address is one every executor reaches

    def run_barrier_stage(self, num_tasks: int, task: BarrierTask, tag: str) -> list[bytes]:
        """Run `task` in `num_tasks` barrier tasks, in job group `tag`; block until done."""
        self.sc.setJobGroup(tag, f"sparkdist job {tag}", True)
        rdd = self.sc.parallelize(range(num_tasks), num_tasks)
        return rdd.barrier().mapPartitions(task).collect()

    def cancel(self, tag: str) -> None:
        self.sc.cancelJobGroup(tag)


class BarrierStage:
    """A `launch.Launch` by Spark: one job's barrier stage, run from a thread so the
    driver can watch the job."""

    def __init__(self, spark: SparkSide, spec: LaunchSpec, state: JobState):
        self.spark = spark
        self.spec = spec
        self.state = state
        self.group = f"sparkdist-{spec.job.job_id}"
        self.error: BaseException | None = None
        self.outputs: list[bytes] | None = None
        self._thread = threading.Thread(target=self._run, name=self.group, daemon=True)

    def _run(self) -> None:
        try:
            task = functools.partial(run_barrier_task, self.spec)
            self.outputs = self.spark.run_barrier_stage(self.spec.num_tasks, task, self.group)
        except BaseException as exc:  # noqa: BLE001 - reported through the job's state
            self.error = exc
            self.state.fail(
                f"the Spark barrier stage failed: {spark_error_summary(exc)}",
                task_raised=python_error_in(exc) is not None,
            )

    def start(self) -> None:
        self._thread.start()

    def wait(self, start_deadline: float, deadline: float | None, launcher_expected: bool) -> None:
        self.state.failures.wait(start_deadline, deadline, launcher_expected)

    def stop(self, finished: bool) -> list[ProcessRecord]:
        """Let the tasks end; cancel the job group if they do not end in time."""
        # A task whose executor was lost will never say it is done: do not wait for it.
        expected = self.state.live_task_count()
        if (
            not self.state.wait_tasks_done(expected, CANCEL_GRACE_S)
            or expected < self.spec.num_tasks
        ):
            logger.info("cancelling Spark job group %s", self.group)
            self.spark.cancel(self.group)
        self._thread.join(timeout=JOIN_TIMEOUT_S)
        return self._wait_local_gone()

    def _wait_local_gone(self) -> list[ProcessRecord]:
        """The job's recorded processes on this machine that did not end within 5 s."""
        local = [p for p in self.state.started_processes() if is_local_address(p.host)]
        return wait_gone(local, timeout_s=5.0)


class RelayedStage(BarrierStage):
    """A barrier stage whose task 0 serves the job (`relay.py`): the client learns how it
    went from the stage's output when it ends, and replays that."""

    # Beyond the job's own limits, which task 0 enforces: the time a stage may wait for
    # its slots and its tasks take to stop.
    GRACE_S = 120.0

    def wait(self, start_deadline: float, deadline: float | None, launcher_expected: bool) -> None:
        from sparkdist.runner.relay import replay

        limit = None if deadline is None else deadline - time.monotonic() + self.GRACE_S
        self._thread.join(timeout=limit)
        if self._thread.is_alive():
            raise JobTimeoutError(
                "timeout: the relayed job's Spark stage had not ended when the job's time "
                "limit ran out (the stage may still be waiting for task slots); it was "
                "cancelled."
            )
        if self.outputs is None:
            self.state.failures.wait(None, None, False)  # raises the stage's failure
            return
        replay(cloudpickle.loads(self.outputs[0]), self.state)

    def stop(self, finished: bool) -> list[ProcessRecord]:
        if self._thread.is_alive():
            logger.info("cancelling Spark operations tagged %s", self.group)
            self.spark.cancel(self.group)
            self._thread.join(timeout=JOIN_TIMEOUT_S)
        return self._wait_local_gone()


def active_spark() -> SparkSide:
    """The active session's `SparkSide`, found as pyspark finds it for both kinds
    (`SparkSession.active()`: this thread's session, else the default one)."""
    from pyspark.sql import SparkSession

    try:
        session = SparkSession.active()
    except Exception:  # noqa: BLE001 - pyspark's NO_ACTIVE_OR_DEFAULT_SESSION
        session = None
    if session is None:
        sc = _active_spark_context()
        if sc is not None:  # a SparkContext made without a SparkSession
            return ClassicSpark(sc)
        raise SparkdistError(
            "np > 0 runs on a Spark cluster, but no SparkSession is active. Start one "
            "(SparkSession.builder.getOrCreate(), or .remote('sc://host:15002') for Spark "
            "Connect) or use np < 0 to run on the driver."
        )
    from sparkdist.connect import is_connect_session

    if is_connect_session(session):
        from sparkdist.runner.spark_connect import ConnectSpark

        return ConnectSpark(session)
    return ClassicSpark(session.sparkContext)


def _active_spark_context():
    try:
        from pyspark import SparkContext
    except ImportError:  # pyspark-client: Connect only
        return None
    return SparkContext._active_spark_context
