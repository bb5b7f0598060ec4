"""What each Spark barrier task of a job does, on its executor.

1. connect to the driver and say which task it is, and open the task's relay
   (`relay.HostRelay`): the supervisors and ranks it starts reach the driver through
   it, over this task's one channel;
2. mpi launcher: start its task agent and tell the driver where it listens (host,
   port, network); the driver hands task 0 every task's, and task 0 runs mpirun over
   all tasks. Direct launcher: every task starts its own ranks at once. A task holds
   `ranks_per_task` consecutive ranks (one by default);
3. wait until the driver says finish or abort (or goes away), then stop everything
   it started: its process groups, then any descendant still alive.

The driver gathers the agents rather than Spark's `BarrierTaskContext.allGather`,
whose tasks check for the answer once a second: a second or more per job.

In relay mode task 0 first starts the job's service (a thread of its Python worker)
and tells the other tasks its address with the one `allGather` of the job; everything
else is the same. Its supervisors get `LEFT_STACKS`: cut off from the task (the stage
cancelled), each leaves its rank's stacks on its host for the client
(`protocol/left_stacks.py`), and a task that lost task 0's service gives them the time
to (`left_stacks.CUT_OFF_LIMIT_S`) before it stops them. What serves the job there is
the driver's business: it comes in the spec (`LaunchSpec.relay`, a `ServiceHost`), so
this module imports nothing of the driver's (the relayed kind's plan is unpickled in
task 0 only in relay mode).
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Protocol

import psutil

from sparkdist import job_environment
from sparkdist.job_environment import DirectRank, gpus_to_env
from sparkdist.network import address_of_interface, interface_of, resolve, split_address
from sparkdist.protocol import left_stacks, messages, owned_dirs, wire
from sparkdist.protocol.launch import (
    LaunchSpec,
    direct_rank_env,
    job_env,
    mpirun_argv,
    start_launcher,
    supervisor_argv,
)
from sparkdist.protocol.processes import ProcessRecord, kill_records, stop_group, wait_gone
from sparkdist.runner.task import rsh
from sparkdist.runner.task.agent import TaskAgent
from sparkdist.runner.task.relay import HostRelay
from sparkdist.runner.task.rsh_relay import LaunchRelay
from sparkdist.runner.task.topology import orted_topology_env
from sparkdist.spark.gpus import gpu_addresses
from sparkdist.spark.task import barrier_context, task_attempt_id, task_context

logger = logging.getLogger(__name__)

SESSION_DIR_BASE = "OMPI_MCA_orte_tmpdir_base"
"""Where Open MPI keeps a process's session tree (`orte_tmpdir_base`)."""


class HostedService(Protocol):
    """The job's service, served from barrier task 0 in the driver's place."""

    address: str

    def abort(self, reason: str) -> None:
        """Task 0 itself failed: stop the job and the service."""

    def finish(self, num_tasks: int) -> bytes:
        """After task 0's own part ended: the job's outcome for the client."""


class ServiceHost(Protocol):
    """What a relayed job's `LaunchSpec.relay` is: it starts the job's service in task 0."""

    @property
    def announces(self) -> bool:
        """The stage's first task is no task of the job: it returns task 0's service
        address as soon as it is known (a relayed warm world, `RelayPlan.announces`)."""

    def host(self, secret: wire.JobSecret, host: str) -> HostedService: ...


class TaskRun:
    """One barrier task's part of one job."""

    def __init__(self, spec: LaunchSpec, index: int, num_tasks: int, host: str):
        self.spec = spec
        self.index = index
        self.num_tasks = num_tasks
        self.host = host
        self.stop_reason: str | None = None
        self._stopped = threading.Event()
        self.agent_places: list[messages.AgentPlace] | None = None
        self._news = threading.Event()
        """Set when every task's agent place arrived (task 0, mpi), or on the stop order."""
        self._children: list[subprocess.Popen] = []
        self._supervised: dict[str, int] = {}
        """The rank of each supervisor this task started, by its launcher name."""
        self.channel = wire.connect(split_address(spec.job.driver), spec.job.secret)
        self._send(messages.TaskHello(index, host, os.getpid(), task_attempt_id()))
        # What this task starts reaches the driver through the task's relay.
        self.relay = HostRelay(spec.job.secret, self._send)
        threading.Thread(target=self._listen, name="sparkdist-task-listen", daemon=True).start()
        self.env = job_env(spec, os.environ, task_host=host, node_rank=index, num_nodes=num_tasks)
        self.env[job_environment.DRIVER] = self.relay.address  # orted's ranks inherit it
        if spec.relay is not None:
            self.env[job_environment.LEFT_STACKS] = left_stacks.job_prefix(spec.job.job_id)
        # Open MPI's session directory, per task: tasks of several jobs (or several
        # "hosts" sharing one /tmp, as executors on one machine do) otherwise share
        # /tmp/ompi.HOSTNAME.UID, and one job's daemon removing it at exit races another's
        # creating its files there ("orte_session_dir failed").
        owned_dirs.sweep()  # what tasks SIGKILLed on this host left
        self.tmpdir = owned_dirs.make(f"{_dir_prefix(spec.job.job_id)}{index}-")
        self.env.setdefault(SESSION_DIR_BASE, self.tmpdir)
        self.mpirun_tmpdir: str | None = None
        self.agent: TaskAgent | None = None
        self.launch_relay: LaunchRelay | None = None

    def _send(self, message) -> None:
        self.channel.send(messages.encode(message))

    def _listen(self) -> None:
        """Until the channel closes: the driver's orders (the first finish or abort stops
        the task), and its frames for the relay's local peers, which still come while
        the task stops (a rank's last reply, a supervisor's `Bye`)."""
        try:
            while True:
                order = messages.decode(self.channel.recv(), messages.TASK_ORDERS)
                if isinstance(order, messages.Rejected):
                    logger.warning(
                        "the driver rejected a report of task %d: %s", self.index, order.reason
                    )
                elif isinstance(order, messages.RELAY_FRAMES):
                    self.relay.deliver(order)
                elif isinstance(order, messages.AgentPlaces):
                    self.agent_places = order.places
                    self._news.set()
                else:
                    self._stop("finish" if isinstance(order, messages.Finish) else "abort")
        except (EOFError, OSError, wire.AuthenticationError, messages.MalformedMessage):
            self._stop("driver lost")
            self.relay.close()  # its supervisors and ranks lose the driver too

    def _stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        self._stopped.set()
        self._news.set()

    # The `launch.LauncherSink` of the processes this task starts: reports to the driver.
    def record(self, record: ProcessRecord) -> None:
        self._send(messages.ProcessStarted(record))

    def launcher_output(self, lines: list[str]) -> None:
        self._send(messages.LauncherOutput(lines))

    def launcher_exited(self, name: str, exit_code: int) -> None:
        self._send(messages.LauncherExit(name, exit_code, self._supervised.get(name, -1)))

    def _start(self, argv: list[str], env: dict[str, str], name: str, role: str) -> None:
        self._children.append(start_launcher(argv, env, name, role, self.host, self))

    def run(self, ctx) -> None:
        self.env.update(gpus_to_env(gpu_addresses(ctx.resources())))
        if self.spec.job.launcher == "mpi":
            # orted (and mpirun) read this host's topology from a file, not the hardware.
            self.env.update(orted_topology_env(self.tmpdir, self.env))
            self.agent = TaskAgent(
                self.spec.job.secret,
                self.host,
                self.env,
                self.record,
                lambda host, detail: self._task_lost(0, host, detail),
            )
            network = interface_of(self.host)[1]
            self._send(messages.AgentPlace(self.host, self.agent.port, network))
            if self.index == 0:
                self._news.wait()
                if self.agent_places is not None and not self._stopped.is_set():
                    self._start_mpirun(self.agent_places)
        else:
            per_task = self.spec.ranks_per_task
            for local_rank in range(per_task):
                rank = self.index * per_task + local_rank
                place = DirectRank(rank, self.spec.num_ranks, local_rank, per_task)
                env = direct_rank_env(self.env, place)
                argv = supervisor_argv(sys.executable)
                name = f"rank {rank}'s supervisor"
                self._supervised[name] = rank
                self._start(argv, env, name, "supervisor")
        self._stopped.wait()

    def _task_lost(self, index: int, host: str, detail: str) -> None:
        """This task lost task `index` (its launch relay lost an agent, or its agent lost
        task 0's relay): the driver hears it before the daemons stop."""
        try:
            self._send(messages.TaskLost(index, host, detail))
        except OSError:
            pass  # the driver is gone too: the job ends anyway

    def _agent_lost(self, task: str, host: str, detail: str) -> None:
        """The launch relay lost `task`'s agent (`task-INDEX`, as `_start_mpirun` names it)."""
        self._task_lost(int(task.removeprefix("task-")), host, detail)

    def _start_mpirun(self, places: list[messages.AgentPlace]) -> None:
        """Task 0: mpirun over every task's agent (`ranks_per_task` slots each); its rsh
        agent (stdlib only, `-S -I`) hands each daemon start to this process's relay."""
        agents = {f"task-{i}": (p.host, p.port) for i, p in enumerate(places)}
        self.launch_relay = LaunchRelay(agents, self.spec.job.secret, self._agent_lost)
        env = {**self.env, **self.launch_relay.env()}
        if env[SESSION_DIR_BASE] == self.tmpdir:
            # mpirun's session tree apart from this task's orted's: a starting orted
            # clears its session tree "in case there are stale directories" (Open MPI's
            # orte_session_dir_cleanup), which would wipe mpirun's live one and race
            # its files ("orte_session_dir failed ... unable to reliably start").
            prefix = f"{_dir_prefix(self.spec.job.job_id)}{self.index}-mpirun-"
            self.mpirun_tmpdir = env[SESSION_DIR_BASE] = owned_dirs.make(prefix)
        argv = mpirun_argv(
            sys.executable,
            self.spec.num_ranks,
            [(f"task-{i}", self.spec.ranks_per_task) for i in range(len(places))],
            [p.network for p in places],
            self.spec.mpi_args,
            rsh_agent=f"{sys.executable} -S -I {rsh.__file__}",
        )
        if self.spec.relay is not None:
            # orted, cut off from mpirun (task 0 cancelled), SIGTERMs each supervisor and
            # SIGKILLs it 1 s later by default: it leaves its rank's stacks first.
            limit = f"{left_stacks.CUT_OFF_LIMIT_S:.0f}"
            argv[1:1] = ["--mca", "odls_base_sigkill_timeout", limit]
        self._start(argv, env, "mpirun", "mpirun")

    def close(self) -> None:
        """Stop every process this task started, then tell the driver it is done."""
        if self.agent is not None:
            self.agent.close()
        settle_s, grace_s = 0.0, 3.0
        if self.stop_reason == "finish":
            settle_s = 5.0
        elif self.stop_reason == "driver lost" and self.spec.relay is not None:
            settle_s = left_stacks.CUT_OFF_LIMIT_S  # its supervisors leave the stacks
        if self.spec.relay is not None:
            grace_s = left_stacks.CUT_OFF_LIMIT_S  # a SIGTERM'd supervisor leaves them first
        for proc in self._children:
            stop_group(proc, grace_s=grace_s, settle_s=settle_s)
        leftovers = [
            ProcessRecord.of(p.pid, "descendant", self.host)
            for p in psutil.Process().children(recursive=True)
        ]
        kill_records(leftovers)
        still = wait_gone(leftovers, timeout_s=5.0)
        if self.launch_relay is not None:
            self.launch_relay.close()
        for tmpdir in (self.tmpdir, self.mpirun_tmpdir):
            if tmpdir is not None:
                shutil.rmtree(tmpdir, ignore_errors=True)
        self.relay.close()
        try:
            self._send(messages.TaskDone([r.pid for r in still]))
        except OSError:
            pass
        self.channel.close()


def task_host(spec: LaunchSpec, executor_address: str) -> str:
    """The address this task offers: the named interface's, else the executor's."""
    if spec.network_interface:
        return address_of_interface(spec.network_interface)
    return resolve(split_address(executor_address)[0])


def _dir_prefix(job_id: str) -> str:
    return f"sparkdist-{job_id}-task"


def remove_task_dirs(job_id: str) -> None:
    """Remove the directories of a job's tasks on this host: those of a task whose
    Python worker was killed (a cancelled stage) stay behind otherwise."""
    pattern = os.path.join(glob.escape(tempfile.gettempdir()), f"{_dir_prefix(job_id)}*")
    for path in glob.glob(pattern):
        shutil.rmtree(path, ignore_errors=True)


def run_barrier_task(spec: LaunchSpec, _rows: Iterator) -> Iterator[bytes]:
    """The function of the job's barrier stage (one call per task). Yields one value per
    task: a relayed job's outcome from task 0, else nothing worth reading (b"")."""
    ctx = barrier_context()
    index = ctx.partitionId()
    infos = ctx.getTaskInfos()
    hosted: HostedService | None = None
    if spec.relay is not None:
        relay: ServiceHost = spec.relay
        first = 1 if relay.announces else 0  # the announcing task is no task of the job
        infos, index = infos[first:], index - first
        if index == 0:
            hosted = relay.host(spec.job.secret, task_host(spec, infos[0].address))
        service = ctx.allGather(hosted.address if hosted else "")[first]
        if index < 0:
            yield service.encode()  # to the client at once; this task's slot frees
            return
        spec = dataclasses.replace(spec, job=dataclasses.replace(spec.job, driver=service))
    host = task_host(spec, infos[index].address)
    try:
        task = TaskRun(spec, index, len(infos), host)
        try:
            task.run(ctx)
        finally:
            task.close()
    except BaseException:
        if hosted is not None:
            hosted.abort("barrier task 0 failed")
        raise
    yield hosted.finish(len(infos)) if hosted is not None else b""


def run_gang_task(spec: LaunchSpec, gang: str, partition: int) -> bytes:
    """The function of an elastic job's plain tasks (`runner/driver/launch/gang.py`): check in
    with the job's gang and either run as the task it seats this one as, or end at once
    when it releases this one."""
    channel = wire.connect(split_address(gang), spec.job.secret)
    try:
        # The address this executor reaches the driver from is one every task reaches.
        host = (
            address_of_interface(spec.network_interface)
            if spec.network_interface
            else channel.sock.getsockname()[0]
        )
        check_in = messages.GangCheckIn(partition, host, os.getpid(), task_attempt_id())
        reply = messages.decode(channel.request(messages.encode(check_in)), messages.GANG_ORDERS)
        if not isinstance(reply, messages.GangSeat):
            return b""
        job = dataclasses.replace(spec.job, driver=reply.driver)
        spec = dataclasses.replace(spec, job=job, num_ranks=reply.num_ranks)
        task = TaskRun(spec, reply.index, reply.num_tasks, host)
        try:
            task.run(task_context())
        finally:
            task.close()
    finally:
        channel.close()
    return b""
