"""The Spark launches of a job: its barrier stage, run from a driver thread so the
driver can watch the job, and stopped (cancelled if need be) when the job ends.

`BarrierStage` serves the job from this process; `RelayedStage` is chosen when the
Spark layer places the job's service inside the stage (`ServicePlace.in_stage`).
"""

from __future__ import annotations

import functools
import logging
import threading
import time

import cloudpickle

from sparkdist.errors import JobTimeoutError
from sparkdist.network import is_local_address
from sparkdist.protocol.launch import LaunchSpec
from sparkdist.protocol.processes import ProcessRecord, wait_gone
from sparkdist.runner.driver.job_state import JobState
from sparkdist.runner.task.spark_task import run_barrier_task
from sparkdist.spark import Cluster, job_tag, python_error_in, spark_error_summary

logger = logging.getLogger(__name__)

CANCEL_GRACE_S = 10.0
JOIN_TIMEOUT_S = 60.0


class BarrierStage:
    """A `launch.Launch` by Spark: one job's barrier stage, run from a thread so the
    driver can watch the job."""

    def __init__(self, spark: Cluster, spec: LaunchSpec, state: JobState, description: str = ""):
        self.description = description
        self.spark = spark
        self.spec = spec
        self.state = state
        self.group = job_tag(spec.job.job_id)
        self.error: BaseException | None = None
        self.outputs: list[bytes] | None = None
        self._thread = threading.Thread(target=self._run, name=self.group, daemon=True)

    def _run(self) -> None:
        try:
            task = functools.partial(run_barrier_task, self.spec)
            self.outputs = self.spark.run_barrier_stage(
                self.spec.num_tasks, task, self.group, self.description
            )
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
        return wait_local_gone(self.state)


def wait_local_gone(state: JobState) -> list[ProcessRecord]:
    """The job's recorded processes on this machine that did not end within 5 s."""
    local = [p for p in state.started_processes() if is_local_address(p.host)]
    return wait_gone(local, timeout_s=5.0)


class RelayedStage(BarrierStage):
    """A barrier stage whose task 0 serves the job (`relay.py`): the client learns how it
    went from the stage's output when it ends, and replays that."""

    # Beyond the job's own limits, which task 0 enforces: the time a stage may wait for
    # its slots and its tasks take to stop.
    GRACE_S = 120.0

    def wait(self, start_deadline: float, deadline: float | None, launcher_expected: bool) -> None:
        from sparkdist.runner.driver.relay import replay

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
