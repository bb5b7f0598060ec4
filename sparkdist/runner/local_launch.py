"""`np < 0`: the ranks run as subprocesses of the driver, for debugging in notebooks.

Same payload, environment, log, result and error path as on the cluster; only the
placement differs (mpirun on localhost, or the supervisors started directly).
"""

from __future__ import annotations

import os
import subprocess
import sys

from sparkdist.backends.gpu import TASK_GPUS_ENV, driver_gpu_addresses
from sparkdist.runner.driver import JobState
from sparkdist.runner.launch import (
    LaunchSpec,
    direct_rank_env,
    job_env,
    mpirun_argv,
    relay_output,
    shared_memory_btl,
    supervisor_argv,
)
from sparkdist.runner.processes import (
    ProcessRecord,
    kill_records,
    popen_group,
    stop_group,
    wait_gone,
)

LOCAL_HOST = "127.0.0.1"


class LocalLaunch:
    def __init__(self, spec: LaunchSpec, state: JobState):
        self.spec = spec
        self.state = state
        self._children: list[subprocess.Popen] = []

    def _start(self, argv: list[str], env: dict[str, str], name: str, role: str) -> None:
        proc = popen_group(
            argv, env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        self._children.append(proc)
        self.state.record(ProcessRecord.of(proc.pid, role, LOCAL_HOST))
        relay_output(
            proc, self.state.launcher_output, lambda code: self.state.launcher_exited(name, code)
        )

    def start(self) -> None:
        n = self.spec.np
        env = job_env(self.spec, os.environ, task_host=LOCAL_HOST, node_rank=0, num_nodes=1)
        gpus = driver_gpu_addresses()
        if gpus:
            env[TASK_GPUS_ENV] = ",".join(gpus)
        if self.spec.launcher == "mpi":
            btl, btl_args = shared_memory_btl()
            argv = mpirun_argv(
                sys.executable,
                n,
                [("localhost", n)],
                ["127.0.0.0/8"],
                [*btl_args, *self.spec.mpi_args],
                use_rsh_agent=False,
                btl=btl,
            )
            self._start(argv, env, "mpirun", "mpirun")
        else:
            for rank in range(n):
                rank_env = direct_rank_env(env, rank, n, rank, n)
                self._start(
                    supervisor_argv(sys.executable),
                    rank_env,
                    f"rank {rank}'s supervisor",
                    "supervisor",
                )

    def wait(self, start_deadline: float, deadline: float | None, launcher_expected: bool) -> None:
        """Until the job succeeded (return) or failed or ran out of time (raise)."""
        self.state.wait(start_deadline, deadline, launcher_expected)

    def stop(self, finished: bool) -> list[ProcessRecord]:
        """Stop everything the job started here; return what could not be stopped.

        After a job that `finished`, its processes get a moment to exit by themselves.
        """
        for proc in self._children:
            stop_group(proc, settle_s=5.0 if finished else 0.0)
        kill_records(self.state.processes)
        return wait_gone(self.state.processes, timeout_s=5.0)
