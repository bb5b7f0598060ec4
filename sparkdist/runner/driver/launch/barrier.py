"""The barrier kind: a fixed-size job on Spark, its ranks started by one barrier stage
run from a driver thread so the driver can watch the job, and stopped (cancelled if need
be) when the job ends. The job's service runs here, on the driver; `relayed.py` is the
same stage served from its task 0.
"""

from __future__ import annotations

import functools
import logging
import threading

from sparkdist.network import is_local_address, join_address
from sparkdist.protocol.launch import LaunchSpec
from sparkdist.protocol.processes import ProcessRecord, wait_gone
from sparkdist.runner.driver import notices
from sparkdist.runner.driver.job_spec import RunnerOptions
from sparkdist.runner.driver.job_state import JobState
from sparkdist.runner.driver.launch.api import AttemptPlan, FixedSizeKind, World
from sparkdist.runner.driver.service import DriverService
from sparkdist.runner.task.spark_task import run_barrier_task
from sparkdist.spark import Cluster, ServicePlace, job_tag, python_error_in, spark_error_summary

logger = logging.getLogger(__name__)

CANCEL_GRACE_S = 10.0
JOIN_TIMEOUT_S = 60.0


class BarrierKind(FixedSizeKind):
    """An `api.LaunchKind`: every attempt one barrier stage of `np` ranks, served from
    the driver where the Spark layer says the executors reach it."""

    def __init__(self, options: RunnerOptions, cluster: Cluster, place: ServicePlace):
        super().__init__(options)
        self.cluster = cluster
        self.place = place

    def form(self, plan: AttemptPlan, why: str) -> World:
        opts = self.options
        state = plan.new_state(opts.num_ranks)
        self.cluster.check_slots(opts.num_ranks, opts.ranks_per_task, opts.start_timeout)
        service = DriverService(state, plan.secret, self.place.bind, self.place.advertise)
        spec = plan.spec(opts.num_ranks, join_address(*service.address))
        logger.info(
            "sparkdist job %s: %d ranks, launcher %s, on the cluster",
            plan.job_id,
            spec.num_ranks,
            plan.launcher,
        )
        stage = BarrierStage(self.cluster, spec, state, plan.description(spec.num_ranks, "barrier"))
        stage.notices = notices.watch(self.cluster, state, notices.fixed_size(opts.num_ranks))
        return World(state, service, stage)


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
        self.notices: notices.NoticeWatcher | None = None
        self._thread = threading.Thread(target=self._run, name=self.group, daemon=True)

    def _run(self) -> None:
        try:
            self.outputs = self._run_stage()
        except BaseException as exc:  # noqa: BLE001 - reported through the job's state
            self.error = exc
            self.state.losses.fail(
                f"the Spark barrier stage failed: {spark_error_summary(exc)}",
                task_raised=python_error_in(exc) is not None,
            )

    def _run_stage(self) -> list[bytes]:
        """Run the stage; what each task yielded."""
        task = functools.partial(run_barrier_task, self.spec)
        return self.spark.run_barrier_stage(self.spec.num_tasks, task, self.group, self.description)

    def start(self) -> None:
        self._thread.start()

    def wait(self, start_deadline: float, deadline: float | None, launcher_expected: bool) -> None:
        self.state.failures.wait(start_deadline, deadline, launcher_expected)

    def stop(self, finished: bool) -> list[ProcessRecord]:
        """Let the tasks end; cancel the job group if they do not end in time."""
        if self.notices is not None:
            self.notices.stop()
        # A task whose executor was lost will never say it is done: do not wait for it.
        expected = self.state.tasks.live_count()
        if (
            not self.state.tasks.wait_done(expected, CANCEL_GRACE_S)
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
    local = [p for p in state.processes.started() if is_local_address(p.host)]
    return wait_gone(local, timeout_s=5.0)
