"""The driver's side of a job: one authenticated server that every task, supervisor
and rank talks to, turning their messages (`messages`) into the job's state
(`job_state.JobState`): a message that concerns one part of it goes to that part, one
that touches several to `JobState`, and a checkpoint message to the job's checkpoint
store (`sparkdist/checkpoint/store.py`), which answers it.

Three kinds of peers connect, each saying first who it is:

* a Spark barrier task (`TaskHello`): reports where its agent listens, the processes
  it started and how its launcher (mpirun) ended; the driver gives task 0 every task's
  agent, and tells each task when to finish or abort;
* a rank's supervisor (`SupervisorHello`): streams the rank's output and its exit
  status;
* a rank itself (`RankHello`): fetches the payload, publishes and reads rendezvous
  values, sends back its result or its traceback, `log_to_driver` messages and
  `sparkdist.report` metrics.

A message this server does not expect gets a `Rejected` reply saying why, so that no
peer waits for an answer that never comes.
"""

from __future__ import annotations

import functools
import logging

from sparkdist.checkpoint.store import REQUESTS as CHECKPOINT_REQUESTS
from sparkdist.protocol import messages, wire
from sparkdist.protocol.messages import MalformedMessage
from sparkdist.runner.driver.job_state import JobState

logger = logging.getLogger(__name__)


class DriverService:
    """The job's server on the driver, bound where the executors can reach it."""

    def __init__(
        self, state: JobState, secret: wire.JobSecret, bind_host: str, advertise_host: str
    ):
        self.state = state
        self._server = wire.Server(secret, self._serve, host=bind_host, name="sparkdist-driver")
        self.address = (advertise_host, self._server.address[1])

    def close(self) -> None:
        self._server.close()

    def _serve(self, channel: wire.Channel) -> None:
        """Serve one peer's channel until it closes (a `wire.Server` handler)."""
        try:
            hello = messages.decode(channel.recv(), messages.HELLOS)
        except MalformedMessage as exc:
            logger.warning("refusing a peer: %s", exc)
            _reject(channel, exc)
            return
        if isinstance(hello, messages.TaskHello):
            _TaskPeer(self.state, channel, hello.index, hello.host).serve()
        elif isinstance(hello, messages.SupervisorHello):
            _SupervisorPeer(self.state, channel, hello.rank, hello.host).serve()
        else:
            _RankPeer(self.state, channel, hello).serve()


def _reject(channel: wire.Channel, exc: MalformedMessage) -> None:
    channel.send(messages.encode(messages.Rejected(str(exc))))


class _StreamPeer:
    """A task or a supervisor: one-way reports until its last one, then it is gone. If
    the connection breaks before that, the peer was lost (`lost`)."""

    kind = ""
    reports: tuple[type, ...] = ()

    def __init__(self, state: JobState, channel: wire.Channel, number: int, host: str):
        self.state, self.channel, self.number, self.host = state, channel, number, host

    def serve(self) -> None:
        stopping = self.state.connected(self.kind, self.number, self.channel)
        if stopping:
            self.channel.send(messages.encode(messages.Abort(stopping)))
        finished = False
        try:
            while not finished:
                try:
                    report = messages.decode(self.channel.recv(), self.reports)
                except MalformedMessage as exc:
                    logger.warning("%s %d sent %s", self.kind, self.number, exc)
                    _reject(self.channel, exc)
                    continue
                finished = self.handle(report)
        finally:
            self.state.peers.remove(self.kind, self.number)
            if not finished:
                self.lost()

    def handle(self, report) -> bool:
        """Act on one report; True after the peer's last one."""
        raise NotImplementedError

    def lost(self) -> None:
        raise NotImplementedError


class _TaskPeer(_StreamPeer):
    """A barrier task: process records and its launcher's output and exit."""

    kind = "task"
    reports = messages.TASK_REPORTS

    def handle(self, report) -> bool:
        match report:
            case messages.ProcessStarted(record):
                self.state.processes.record(record)
            case messages.AgentPlace():
                self.state.agent_placed(self.number, report)
            case messages.LauncherOutput(lines):
                self.state.processes.launcher_output(lines)
            case messages.LauncherExit(name, code):
                self.state.losses.launcher_exited(name, code)
            case messages.TaskDone():
                self.state.tasks.finished(self.number)
                return True
        return False

    def lost(self) -> None:
        self.state.losses.task_lost(self.number, self.host)


class _SupervisorPeer(_StreamPeer):
    """A rank's supervisor: the rank's output lines and exit status."""

    kind = "supervisor"
    reports = messages.SUPERVISOR_REPORTS

    def serve(self) -> None:
        self.state.rank_records.located(self.number, self.host)
        super().serve()

    def handle(self, report) -> bool:
        match report:
            case messages.ProcessStarted(record):
                self.state.processes.record(record)
            case messages.RankOutput(lines):
                self.state.rank_records.output(self.number, lines)
            case messages.RankExit(code, tail):
                self.state.losses.rank_exited(self.number, code, tail)
                self.channel.send(messages.encode(messages.Bye()))
                return True
        return False

    def lost(self) -> None:
        self.state.losses.supervisor_lost(self.number)


class _RankPeer:
    """A rank: its payload, then requests, each answered."""

    def __init__(self, state: JobState, channel: wire.Channel, hello: messages.RankHello):
        self.state, self.channel, self.rank = state, channel, hello.rank
        self.host = hello.host

    def serve(self) -> None:
        state, spec = self.state, self.state.job
        state.rank_records.started(self.rank, self.host)
        welcome = messages.Welcome(
            spec.payload,
            spec.all_results or self.rank == 0,
            spec.job_id,
            spec.rank0_env if self.rank == 0 else messages.SecretEnv(),
        )
        self.channel.send(messages.encode(welcome))
        try:
            while True:
                raw = self.channel.recv()
                try:
                    reply = self._answer(messages.decode(raw, messages.RANK_REQUESTS))
                except MalformedMessage as exc:
                    logger.warning("rank %d sent %s", self.rank, exc)
                    reply = messages.Rejected(str(exc))
                self.channel.send(messages.encode(reply))
        finally:
            state.checkpoints.unpin(self._reader)  # a rank gone reads no checkpoint

    def _answer(self, request) -> tuple:
        state, rank = self.state, self.rank
        if isinstance(request, CHECKPOINT_REQUESTS):  # the job's store answers them
            stored = functools.partial(state.answer_checkpoint, rank)
            return state.checkpoints.answer(request, self._reader, stored)
        match request:
            case messages.KvPut(key, value):
                state.rendezvous.put(key, value)
            case messages.KvGet(key, timeout_s):
                found, value = state.rendezvous.get(key, timeout_s)
                return messages.Ok(value) if found else messages.Missing(key)
            case messages.Log(text):
                state.console.write("stdout", f"[rank {rank}] {text}")
            case messages.FileUpload(name, data):
                with state.cond:
                    state.files[name] = data
            case messages.Result(value, frameworks):
                state.rank_result(rank, value, frameworks)
            case messages.RankError(traceback, reason):
                state.losses.rank_error(rank, traceback, reason)
            case messages.Report(step, metrics):
                return self._report(step, metrics)
        return messages.Ok()

    @property
    def _reader(self) -> tuple[str, int]:
        return (self.state.job.job_id, self.rank)

    def _report(self, step: int, metrics: dict) -> tuple:
        bad = [k for k, v in metrics.items() if not isinstance(k, str) or
               isinstance(v, bool) or not isinstance(v, (int, float))]  # fmt: skip
        if bad:
            return messages.Failed(f"metrics must map names to numbers; bad: {bad}")
        pruned = self.state.metrics.add(self.rank, step, metrics)
        return messages.Ok("prune" if pruned else None)
