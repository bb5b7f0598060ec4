"""The driver-local kind (`np < 0`): the ranks run as subprocesses of the driver, for
debugging in notebooks.

Same payload, environment, log, result and error path as on the cluster; only the
placement differs (mpirun on localhost, or the supervisors started directly).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable
from typing import NamedTuple

from sparkdist.job_environment import DirectRank, gpus_to_env
from sparkdist.network import join_address
from sparkdist.protocol.launch import (
    LaunchSpec,
    direct_rank_env,
    job_env,
    mpirun_argv,
    shared_memory_btl,
    start_launcher,
    supervisor_argv,
)
from sparkdist.protocol.processes import ProcessRecord, kill_records, stop_group, wait_gone
from sparkdist.runner.driver.job_state import JobState
from sparkdist.runner.driver.launch.api import AttemptPlan, FixedSizeKind, World
from sparkdist.runner.driver.service import DriverService
from sparkdist.spark.gpus import driver_gpu_addresses

logger = logging.getLogger(__name__)

LOCAL_HOST = "127.0.0.1"


class DriverLocalKind(FixedSizeKind):
    """An `api.LaunchKind`: every attempt's ranks on this machine, served from here."""

    def form(self, plan: AttemptPlan, why: str) -> World:
        state = plan.new_state(self.options.num_ranks)
        service = DriverService(state, plan.secret, LOCAL_HOST, LOCAL_HOST)
        spec = plan.spec(state.job.num_ranks, join_address(*service.address))
        logger.info(
            "sparkdist job %s: %d ranks, launcher %s, on the driver",
            plan.job_id,
            spec.num_ranks,
            plan.launcher,
        )
        return World(state, service, LocalLaunch(spec, state))


class Reports(NamedTuple):
    """The `launch.LauncherSink` of the launchers started here: what a task reports to
    the service about its launcher (`service._TaskPeer`), given straight to the parts
    of the job's state it concerns."""

    record: Callable[[ProcessRecord], None]
    launcher_output: Callable[[list[str]], None]
    launcher_exited: Callable[[str, int], None]


class LocalLaunch:
    """A `launch.Launch` on the driver."""

    def __init__(self, spec: LaunchSpec, state: JobState):
        self.spec = spec
        self.state = state
        self._children: list[subprocess.Popen] = []
        self._reports = Reports(
            state.processes.record, state.processes.launcher_output, state.losses.launcher_exited
        )

    def _start(self, argv: list[str], env: dict[str, str], name: str, role: str) -> None:
        self._children.append(start_launcher(argv, env, name, role, LOCAL_HOST, self._reports))

    def start(self) -> None:
        n = self.spec.num_ranks
        env = job_env(self.spec, os.environ, task_host=LOCAL_HOST, node_rank=0, num_nodes=1)
        env.update(gpus_to_env(driver_gpu_addresses()))
        if self.spec.job.launcher == "mpi":
            btl, btl_args = shared_memory_btl()
            argv = mpirun_argv(
                sys.executable,
                n,
                [("localhost", n)],
                ["127.0.0.0/8"],
                [*btl_args, *self.spec.mpi_args],
                btl=btl,
            )
            self._start(argv, env, "mpirun", "mpirun")
        else:
            for rank in range(n):
                rank_env = direct_rank_env(env, DirectRank(rank, n, rank, n))
                self._start(
                    supervisor_argv(sys.executable),
                    rank_env,
                    f"rank {rank}'s supervisor",
                    "supervisor",
                )

    def wait(self, start_deadline: float, deadline: float | None, launcher_expected: bool) -> None:
        self.state.failures.wait(start_deadline, deadline, launcher_expected)

    def stop(self, finished: bool) -> list[ProcessRecord]:
        for proc in self._children:
            stop_group(proc, settle_s=5.0 if finished else 0.0)
        started = self.state.processes.started()
        kill_records(started)
        return wait_gone(started, timeout_s=5.0)
