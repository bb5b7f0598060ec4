"""What the driver knows about a running job, as its peers' messages build it up:
the ranks, the Spark tasks, the processes started, results and files, and the
launcher's end. Shared by the driver's handler threads under one lock (`cond`).

Its parts each have a module of their own: the failures (`failures.FailureTracker`,
which also owns the wait for the job), the rendezvous store (`rendezvous`), and where
rank output is printed (`console`). `driver` turns messages into calls on it.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from sparkdist.errors import describe_exit
from sparkdist.protocol import messages, wire
from sparkdist.protocol.processes import ProcessRecord
from sparkdist.roles import SERVERS, Roles
from sparkdist.runner.driver.checkpoint_store import CheckpointStore
from sparkdist.runner.driver.console import Console
from sparkdist.runner.driver.failures import FailureTracker
from sparkdist.runner.driver.metrics import ReportedMetrics
from sparkdist.runner.driver.rendezvous import RendezvousStore

logger = logging.getLogger(__name__)


@dataclass
class RankState:
    rank: int
    host: str = "?"
    started: bool = False
    exit_code: int | None = None
    exited: bool = False
    traceback: str | None = None
    result: bytes | None = None
    has_result: bool = False
    tail: deque = field(default_factory=lambda: deque(maxlen=messages.TAIL_LINES))


@dataclass
class JobSpec:
    """What the driver tells every rank when it says hello."""

    job_id: str
    num_ranks: int
    payload: bytes
    all_results: bool
    log_mode: str
    ranks_per_task: int = 1
    """Task i runs ranks i * ranks_per_task ... (i + 1) * ranks_per_task - 1."""
    roles: Roles | None = None
    """A parameter-server job's roles: its server ranks stop when the chief is done."""
    rank0_env: messages.SecretEnv = field(default_factory=messages.SecretEnv, repr=False)
    """Credentials only rank 0 gets (with its `Welcome`, over the encrypted channel)."""

    def server_rank(self, rank: int) -> bool:
        return self.roles is not None and self.roles.role_of(rank)[0] in SERVERS

    def tolerates_loss(self, rank: int) -> bool:
        """A parameter-server worker: its coordinator reschedules what it was running."""
        return self.roles is not None and self.roles.role_of(rank)[0] == "worker"

    @property
    def num_tasks(self) -> int:
        return self.num_ranks // self.ranks_per_task


class JobState:
    """Everything the driver knows about a running job; safe across handler threads."""

    def __init__(
        self,
        job: JobSpec,
        console: Console | None = None,
        checkpoints: CheckpointStore | None = None,
        metrics: ReportedMetrics | None = None,
    ):
        self.job = job
        self.console = console or Console()
        self.checkpoints = checkpoints
        self.metrics = metrics or ReportedMetrics()
        """Where the ranks' `sparkdist.report` calls go."""
        self.cond = threading.Condition()
        self.ranks = {r: RankState(r) for r in range(job.num_ranks)}
        self.processes: list[ProcessRecord] = []
        self.files: dict[str, bytes] = {}
        self.launcher_tail: deque = deque(maxlen=messages.TAIL_LINES)
        self.launcher_exit: int | None = None
        self.frameworks: list[str] = []
        self.tasks_started: set[int] = set()
        self.tasks_done: set[int] = set()
        self.tasks_lost: dict[int, str] = {}
        """Spark tasks whose agent connection broke before they finished, with why."""
        self.agent_places: dict[int, messages.AgentPlace] = {}
        self.rendezvous = RendezvousStore()
        self.failures = FailureTracker(self)
        self._peers: dict[tuple[str, int], wire.Channel] = {}
        self.workers_lost: set[int] = set()
        self.grow_reason: str | None = None
        """Elastic jobs: why the world should grow (more slots stayed free), if it should."""
        self.resizing: str | None = None
        """Elastic jobs: rank 0 was told to stop after its checkpoint, so the job can grow."""

    # --- peers ------------------------------------------------------------------------

    def connected(self, kind: str, number: int, channel: wire.Channel) -> str | None:
        """A task or supervisor connected; returns why the job is stopping, if it is
        (the peer is then told to abort at once)."""
        with self.cond:
            self._peers[(kind, number)] = channel
            if kind == "task":
                self.tasks_started.add(number)
            late_server = self._chief_done() and self._server_peer(kind, number)
        if late_server:
            self._finish_servers([channel])
        return self.failures.stopping

    def disconnected(self, kind: str, number: int) -> None:
        with self.cond:
            self._peers.pop((kind, number), None)

    def stop(self, how: str, reason: str) -> None:
        """Tell every task to finish (`how="finish"`), or every task and supervisor to
        abort (`how="abort"`)."""
        if how == "abort":
            self.failures.stop(reason)
            self.rendezvous.close()
        order = messages.Abort(reason) if how == "abort" else messages.Finish(reason)
        with self.cond:
            channels = [c for (k, _), c in self._peers.items() if k == "task" or how == "abort"]
        for channel in channels:
            try:
                channel.send(messages.encode(order))
            except OSError:
                pass

    # --- state changes ----------------------------------------------------------------

    def record(self, record: ProcessRecord) -> None:
        with self.cond:
            if record not in self.processes:
                self.processes.append(record)

    def agent_placed(self, index: int, place: messages.AgentPlace) -> None:
        """Task `index`'s agent listens at `place`; once every task's does, task 0 gets
        them all and starts mpirun over them."""
        with self.cond:
            self.agent_places[index] = place
            if sorted(self.agent_places) != list(range(self.job.num_tasks)):
                return
            places = [self.agent_places[i] for i in range(self.job.num_tasks)]
            task0 = self._peers.get(("task", 0))
        if task0 is not None:
            try:
                task0.send(messages.encode(messages.AgentPlaces(places)))
            except OSError:
                pass  # task 0 is gone: its loss fails the job

    def task_done(self, index: int) -> None:
        with self.cond:
            self.tasks_done.add(index)
            self.cond.notify_all()

    def task_lost(self, index: int, host: str) -> None:
        """A task's connection broke before it said it was done."""
        first = index * self.job.ranks_per_task  # the task's first rank
        rank = first if first in self.ranks else None
        reason = (
            f"lost contact with Spark task {index} on host {host}: its "
            "executor died, or the host or its network was lost"
        )
        with self.cond:
            self.tasks_lost[index] = reason
            if rank is not None and self.ranks[rank].host == "?":
                self.ranks[rank].host = host
        self.failures.notice(rank, reason, outside_user_code=True)

    def request_grow(self, reason: str) -> None:
        """Ask rank 0 to stop at its next checkpoint, so the job relaunches larger."""
        with self.cond:
            self.grow_reason = reason

    def answer_checkpoint(self, rank: int, step: int) -> str | None:
        """After rank `rank` stored checkpoint `step`: "grow" when the job should stop
        there to grow (rank 0 then ends), else None."""
        with self.cond:
            if rank != 0 or self.grow_reason is None or self.resizing is not None:
                return None
            self.resizing = f"{self.grow_reason}; resuming from step {step}"
            self.failures.stop("growing")
            return "grow"

    def rank_started(self, rank: int, host: str) -> None:
        with self.cond:
            self.ranks[rank].started = True
            self.ranks[rank].host = host
            self.cond.notify_all()

    def rank_output(self, rank: int, lines: list[tuple[str, str]]) -> None:
        with self.cond:
            self.ranks[rank].tail.extend(line for _, line in lines)
        if self.job.log_mode == "all":
            for stream, line in lines:
                self.console.write(stream, f"[rank {rank}] {line}")

    def rank_result(self, rank: int, value: bytes, frameworks: list[str]) -> None:
        with self.cond:
            self.ranks[rank].result = value
            self.ranks[rank].has_result = True
            if rank == 0:
                self.frameworks = frameworks
            self.cond.notify_all()
            servers = [c for peer, c in self._peers.items() if self._server_peer(*peer)]
        if self._chief_done() and servers:
            self._finish_servers(servers)

    def _chief_done(self) -> bool:
        """A parameter-server job's chief returned: its servers are to stop."""
        return self.job.roles is not None and self.ranks[0].has_result

    def _server_peer(self, kind: str, number: int) -> bool:
        return kind == "supervisor" and self.job.server_rank(number)

    def _finish_servers(self, channels: list[wire.Channel]) -> None:
        """The chief is done: its servers (which never return) are stopped."""
        order = messages.encode(messages.Finish("the chief finished"))
        for channel in channels:
            try:
                channel.send(order)
            except OSError:
                pass  # that supervisor is gone already

    def rank_error(self, rank: int, traceback: str, reason: str) -> None:
        with self.cond:
            self.ranks[rank].traceback = traceback
        self.failures.notice(rank, reason)

    def rank_exited(self, rank: int, exit_code: int, tail: list[str]) -> None:
        state = self.ranks[rank]
        with self.cond:
            state.exited = True
            state.exit_code = exit_code
            if tail:
                state.tail.extend(line for line in tail if line not in state.tail)
            self.cond.notify_all()
        if exit_code != 0 and self.job.tolerates_loss(rank) and state.traceback is None:
            self.worker_lost(rank, exit_code)
        elif exit_code != 0:
            killed = exit_code == -signal.SIGKILL and state.traceback is None
            self.failures.notice(rank, None, outside_user_code=killed)

    def worker_lost(self, rank: int, exit_code: int | None) -> None:
        """A parameter-server worker ended without an error of its own (killed, its host
        lost): the job goes on while another worker is left."""
        workers = self.job.roles.ranks_of("worker")
        with self.cond:
            self.workers_lost.add(rank)
            left = len(workers) - len(self.workers_lost)
        how = f"ended with {describe_exit(exit_code)}"
        if left > 0:
            logger.warning(
                "sparkdist job %s: worker rank %d %s; the chief's coordinator runs its steps "
                "on the %d worker(s) left", self.job.job_id, rank, how, left,
            )  # fmt: skip
            return
        self.failures.notice(
            rank,
            f"every worker of the parameter-server job was lost (the last, rank {rank}, {how})",
            outside_user_code=True,
        )

    def launcher_output(self, lines: list[str]) -> None:
        with self.cond:
            self.launcher_tail.extend(lines)
        for line in lines:
            logger.debug("mpirun: %s", line)

    def launcher_exited(self, name: str, exit_code: int) -> None:
        """mpirun (or a direct launcher's supervisor process) ended."""
        with self.cond:
            if name == "mpirun":
                self.launcher_exit = exit_code
            self.cond.notify_all()
        if exit_code != 0:
            self.failures.notice(None, f"{name} exited with code {exit_code}")

    def fail(self, reason: str, task_raised: bool = False) -> None:
        """A failure seen outside the ranks (e.g. the Spark stage itself failed; with
        `task_raised`, because a task's own code raised)."""
        self.failures.notice(None, reason, task_raised=task_raised)

    # --- the driver's view ------------------------------------------------------------

    def succeeded(self) -> bool:
        needed = self.ranks.values() if self.job.all_results else [self.ranks[0]]
        needed = [s for s in needed if not self.job.server_rank(s.rank)]
        return (
            all(
                s.exited and (s.exit_code == 0 or r in self.workers_lost)
                for r, s in self.ranks.items()
            )
            and all(s.has_result for s in needed)
            and self.launcher_exit in (None, 0)
        )

    def all_started(self) -> bool:
        return all(s.started for s in self.ranks.values())

    def tails(self, ranks: list[int]) -> str:
        """The last lines of each of `ranks`, for an error message."""
        parts = []
        for rank in ranks:
            tail = list(self.ranks[rank].tail)[-10:]
            if tail:
                parts.append(f"\nLast lines of rank {rank}:\n" + "\n".join(f"  {t}" for t in tail))
        return "".join(parts)

    def started_processes(self) -> list[ProcessRecord]:
        """Every process the job reported starting, so far."""
        with self.cond:
            return list(self.processes)

    def live_task_count(self) -> int:
        """How many Spark tasks connected and were not lost: those whose end to await."""
        with self.cond:
            return len(self.tasks_started - self.tasks_lost.keys())

    def results(self) -> list[bytes | None]:
        return [self.ranks[r].result for r in range(self.job.num_ranks)]

    def wait_tasks_done(self, count: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while len(self.tasks_done) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.cond.wait(min(remaining, 0.2))
        return True
