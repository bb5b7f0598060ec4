"""What the driver knows about a running job, as its peers' messages build it up.
Shared by the driver service's event loop and the launch's threads under one lock (`cond`).

`JobState` holds one part per concern, as plain records (`records.py`): what the job is
(`job`), each rank's record (`rank_records`), the Spark tasks (`tasks`), the processes
started and the launcher's end (`processes`), the open channels (`peers`), an elastic
job's growth (`growth`), an in-process elastic world's membership (`membership`,
`membership.py`) and the rendezvous store (`rendezvous`), the requests for the ranks'
stacks (`stacks`) and their signs of life (`life`), `stalls.py`; plus how ends become
failures and which failure explains the job (`losses` and `failures`, `failures.py`),
where rank output is printed (`console`), and the job's checkpoint store
(`checkpoints`, `sparkdist/checkpoint/driver/store.py`), which outlives the attempt.

Whoever learns of an event that concerns one part (the service, a launch) calls that
part. `JobState`'s own methods are only the events that touch several parts.
"""

from __future__ import annotations

import threading

from sparkdist.checkpoint.driver.store import CheckpointStore, NoStore
from sparkdist.protocol import messages
from sparkdist.runner.driver.console import Console
from sparkdist.runner.driver.failures import FailureTracker, Losses
from sparkdist.runner.driver.job_spec import JobSpec
from sparkdist.runner.driver.membership import Membership
from sparkdist.runner.driver.metrics import ReportedMetrics
from sparkdist.runner.driver.records import (
    Growth,
    Link,
    Peers,
    Processes,
    RankRecords,
    RankState,
    RendezvousStore,
    SparkTasks,
    send,
)
from sparkdist.runner.driver.stalls import SignsOfLife, StackRequests
from sparkdist.trace.recorder import JobTrace


class JobState:
    """Everything the driver knows about a running job; safe across handler threads."""

    def __init__(
        self,
        job: JobSpec,
        console: Console | None = None,
        checkpoints: CheckpointStore | NoStore | None = None,
        metrics: ReportedMetrics | None = None,
        trace: JobTrace | None = None,
    ):
        self.job = job
        self.console = console or Console()
        self.checkpoints = checkpoints if checkpoints is not None else NoStore()
        """The job's checkpoint store: it answers the ranks' checkpoint messages."""
        self.metrics = metrics or ReportedMetrics()
        """Where the ranks' `sparkdist.report` calls go."""
        self.trace = trace if trace is not None else JobTrace(job.job_id)
        """The job's trace (`sparkdist/trace/recorder.py`), which outlives the attempt."""
        self.cond = cond = threading.Condition()
        self.files: dict[str, bytes] = {}
        """Files the ranks uploaded (a Horovod timeline), by name."""
        self.tasks = SparkTasks(job.num_tasks, cond)
        self.rendezvous = RendezvousStore()
        self.rank_records = RankRecords(job.num_ranks, cond, self.console, job.log_mode)
        self.ranks: dict[int, RankState] = self.rank_records.by_rank
        """Each rank's record (the same dict as `rank_records.by_rank`)."""
        self.processes = Processes(cond)
        self.growth = Growth(cond)
        self.peers = Peers(cond)
        self.membership = Membership(cond, self.rank_records, job.in_process_min_np)
        self.membership.on_form = self._formed
        self.membership.on_wait = self.trace.world_waits
        self.failures = FailureTracker(
            cond,
            self.rank_records,
            self.tasks,
            self.processes,
            self.growth,
            self.membership,
            self.succeeded,
        )
        self.losses = Losses(
            job,
            self.rank_records,
            self.tasks,
            self.processes,
            self.failures,
            self.membership,
            self.trace,
        )
        self.stacks = StackRequests(cond, self.peers, self.rank_records)
        """The driver's requests for its ranks' stacks (`stalls.py`)."""
        self.life = SignsOfLife()
        """When the ranks last showed a sign of life, and their step rates."""
        self.warm = None
        """A warm world's `warm.WarmDispatch`: its idle ranks' next runs; else None."""

    def connected(self, kind: str, number: int, channel: Link) -> str | None:
        """A task or supervisor connected; returns why the job is stopping, if it is
        (the peer is then told to abort at once). A parameter-server job's server whose
        chief is done already is told to finish."""
        with self.cond:
            self.peers.add(kind, number, channel)
            if kind == "task":
                self.tasks.connected(number)
            late_server = self._chief_done() and self._server_peer(kind, number)
        if late_server:
            send([channel], messages.Finish("the chief finished"))
        return self.failures.stopping

    def stop(self, how: str, reason: str) -> None:
        """Tell every task to finish (`how="finish"`), or every task and supervisor to
        abort (`how="abort"`)."""
        if how == "abort":
            self.failures.stop(reason)
            self.rendezvous.close()
        self.membership.close(f"the job is stopping: {reason}")
        lost = bool(self.tasks.lost)  # a relayed job's stage may end with no answer
        order = messages.Abort(reason, lost) if how == "abort" else messages.Finish(reason)
        send(self.peers.select(lambda kind, _: kind == "task" or how == "abort"), order)

    def agent_placed(self, index: int, place: messages.AgentPlace) -> None:
        """Task `index`'s agent listens at `place`; once every task's does, task 0 gets
        them all and starts mpirun over them (task 0 gone: its loss fails the job)."""
        with self.cond:
            places = self.tasks.placed(index, place)
            task0 = self.peers.channel("task", 0)
        if places is not None and task0 is not None:
            send([task0], messages.AgentPlaces(places))

    def rank_result(self, rank: int, value: bytes, frameworks: list[str]) -> None:
        """A rank's function returned; the chief's return stops a parameter-server job's
        servers (TensorFlow servers, which never return)."""
        with self.cond:
            self.rank_records.result(rank, value, frameworks)
            servers = self.peers.select(self._server_peer)
        if servers and self._chief_done():
            send(servers, messages.Finish("the chief finished"))

    def answer_checkpoint(self, rank: int, step: int) -> str | None:
        """After rank `rank` stored checkpoint `step`: "grow" when the job should stop
        there to grow (rank 0 then ends; later losses are no failures), else None."""
        with self.cond:
            if self.membership.in_process():
                return None  # an in-process world grows as it runs, not by a relaunch
            answer = self.growth.answer_checkpoint(rank, step)
            if answer == "grow":
                self.failures.stop("growing")
        return answer

    def checkpoint_due(self) -> bool:
        """Whether rank 0's `save(..., every=N)` should save at this step: the job stops
        at its next checkpoint (to grow, or to leave a decommissioned executor)."""
        with self.cond:
            pending = self.growth.reason is not None and self.growth.resizing is None
            return pending and not self.membership.in_process()

    def succeeded(self) -> bool:
        """Every rank ended well (or was a worker the job could lose, or a rank an
        in-process world went on without or has not taken in yet), the results the job
        waits for arrived (from the last generation's members; a server sends none), and
        mpirun, if any, exited with 0."""
        with self.cond:
            members = self.membership.generation.members
            needed = members if self.job.all_results else members[:1]
            needed = [r for r in needed if not self.job.server_rank(r)]
            membership = self.membership
            tolerated = self.losses.workers_lost | membership.left.keys() | membership.joining
            ended = self.rank_records.succeeded(needed, tolerated)
            return ended and self.processes.launcher_exit_code in (None, 0)

    def results(self) -> list[tuple[int, bytes | None]]:
        """Each member's result, in world-rank order of the last generation (every rank
        in order, unless an in-process world changed), with its launch rank."""
        with self.cond:
            members = self.membership.generation.members
            return [(r, self.ranks[r].result) for r in members]

    def add_ranks(self, ranks: list[int], reason: str) -> None:
        """An in-process world seated newcomers that run `ranks` (fresh launch ranks)."""
        with self.cond:
            self.rank_records.add(ranks)
            self.membership.seat(ranks, reason)

    def _formed(self, generation) -> None:
        """An in-process world's generation formed: the trace's world changes."""
        self.trace.world(len(generation.members), generation.number, generation.reason)

    def _chief_done(self) -> bool:
        """A parameter-server job's chief returned: its servers are to stop."""
        with self.cond:
            return self.job.roles is not None and self.ranks[0].has_result

    def _server_peer(self, kind: str, number: int) -> bool:
        return kind == "supervisor" and self.job.server_rank(number)
