"""The driver's side of a job: one authenticated, event-driven server (`EventServer`:
one asyncio loop thread, however many peers) that every task, supervisor and rank
talks to, turning their messages (`messages`) into the job's state
(`job_state.JobState`): a message that concerns one part of it goes to that part, one
that touches several to `JobState`, and a checkpoint message to the job's checkpoint
store (`sparkdist/checkpoint/driver/store.py`), which answers it.

Peers connect, each saying first who it is:

* a Spark barrier task (`TaskHello`): reports where its agent listens, the processes
  it started and how its launcher (mpirun) ended; the driver gives task 0 every task's
  agent, and tells each task when to finish or abort;
* a rank's supervisor (`SupervisorHello`): streams the rank's output and its exit
  status;
* a rank itself (`RankHello`): fetches the payload, publishes and reads rendezvous
  values, sends back its result or its traceback, `log_to_driver` messages and
  `sparkdist.report` metrics, and asks for an in-process elastic world's next
  generation (`ElasticWorld`, answered by the job's `membership`);
* whoever holds the job's secret and asks where each rank is (`WhereHello`: a relayed
  job's interrupted client, through a plain Spark task) gets the grouped stacks once;
* a relayed warm world's run (`WarmCarry`, from the client through a plain Spark task)
  is answered when it ended.

A task's supervisors and ranks come through the task's relay (`runner/task/relay.py`):
each is a stream of the task's one channel (`Relayed` frames, ended by `RelayClosed`),
served by the same handler its own connection would get, and lost with that channel.
The payload goes once per relay: its next ranks get an empty one, which it fills in.
Ranks the driver starts itself (`np < 0`) connect directly.

Each peer is a handler of its messages, one at a time (`received`), on the loop: a
rendezvous read waits for its key, and an elastic rank for its next world, on a loop
timer, not a thread, and checkpoint requests, which may write to storage, run on the
server's small pool of threads.

A message this server does not expect gets a `Rejected` reply saying why, so that no
peer waits for an answer that never comes.
"""

from __future__ import annotations

import asyncio
import functools
import logging

from sparkdist.checkpoint.driver.store import REQUESTS as CHECKPOINT_REQUESTS
from sparkdist.protocol import messages, wire
from sparkdist.protocol.messages import MalformedMessage
from sparkdist.runner.driver.event_server import EventChannel, EventServer
from sparkdist.runner.driver.job_state import JobState
from sparkdist.runner.driver.records import Link
from sparkdist.runner.driver.stalls import where

logger = logging.getLogger(__name__)

LOCAL_HELLOS = (messages.SupervisorHello, messages.RankHello)
"""Who may speak through a task's relay."""


class DriverService:
    """The job's server on the driver, bound where the executors can reach it."""

    def __init__(
        self, state: JobState, secret: wire.JobSecret, bind_host: str, advertise_host: str
    ):
        self.state = state
        self.payload_bytes_sent = 0
        """Bytes of payload sent in `Welcome`s (the simulator and the tests read it)."""
        self._server = EventServer(secret, self._serve, host=bind_host, name="sparkdist-driver")
        self.address = (advertise_host, self._server.address[1])

    @property
    def connections_max(self) -> int:
        """The most peer connections the service held at once."""
        return self._server.connections_max

    def close(self) -> None:
        self._server.close()

    async def _serve(self, channel: EventChannel) -> None:
        """Serve one peer's connection until it closes (an `EventServer` handler)."""
        peer = self.greet(await channel.recv(), channel, messages.HELLOS)
        if peer is None:
            return
        try:
            while not peer.received(await channel.recv()):
                pass
        except asyncio.CancelledError:
            raise  # the service stops: nobody is lost
        except BaseException:
            peer.closed()
            raise
        peer.closed()

    def greet(self, raw, link: Link, hellos: tuple[type, ...]) -> _Peer | None:
        """The peer a hello (one of `hellos`) announces, opened; None (and a `Rejected`)
        for anything else."""
        try:
            hello = messages.decode(raw, hellos)
        except MalformedMessage as exc:
            logger.warning("refusing a peer: %s", exc)
            _reject(link, exc)
            return None
        if isinstance(hello, messages.TaskHello):
            peer: _Peer = _TaskPeer(self.state, link, hello.index, hello.host)
            self.state.tasks.identified(hello.index, hello.spark_task_id)
            self.state.trace.task_started(hello.index)
            peer.streams = _TaskStreams(self, link)  # its relay's local peers
        elif isinstance(hello, messages.SupervisorHello):
            peer = _SupervisorPeer(self.state, link, hello.rank, hello.host)
        elif isinstance(hello, messages.WhereHello):
            peer = _WherePeer(self, link, hello.why)
        elif isinstance(hello, messages.WarmCarry):
            peer = _CarrierPeer(self, link, hello)
        else:
            peer = _RankPeer(self, link, hello)
        peer.opened()
        return peer

    def welcome(self, rank: int, host: str, link: Link) -> messages.Welcome:
        """What rank `rank` gets first: the payload (once per task's relay: the relay
        gives the next ranks the payload it got), and what it is to send back."""
        spec = self.state.job
        relay = link.relay if isinstance(link, _StreamLink) else None
        payload = b"" if relay is not None and relay.payload_sent else spec.payload
        if relay is not None:
            relay.payload_sent = True
        self.payload_bytes_sent += len(payload)
        # An in-process elastic world's rank 0 may change: every rank sends its result.
        send_result = spec.all_results or rank == 0 or spec.in_process_min_np is not None
        return messages.Welcome(
            payload,
            send_result,
            spec.job_id,
            spec.rank0_env if rank == 0 else messages.SecretEnv(),
            self.state.trace.rank_connected(rank, host),
        )

    def offload(self, work, done) -> None:
        """Run `work()`, which may block, off the loop; then `done(its result)` on it, or
        `done(Failed(...))` if it raised."""

        def finished(future: asyncio.Future) -> None:
            if future.cancelled():
                return  # the service stopped
            if future.exception() is not None:
                logger.error("a request failed", exc_info=future.exception())
                done(messages.Failed(repr(future.exception())))
            else:
                done(future.result())

        self._server.offload(work).add_done_callback(finished)

    def later(self, delay_s: float, call, *args) -> asyncio.TimerHandle:
        """Call `call(*args)` on the loop after `delay_s` seconds."""
        return self._server.loop.call_later(delay_s, call, *args)

    def on_loop(self, call, *args) -> None:
        """Call `call(*args)` on the loop (from any thread); dropped once it stopped."""
        try:
            self._server.loop.call_soon_threadsafe(call, *args)
        except RuntimeError:
            pass


def _reject(link: Link, exc: MalformedMessage) -> None:
    link.send(messages.encode(messages.Rejected(str(exc))))


class _Peer:
    """A task, supervisor or rank: a handler of its messages, whichever way they come."""

    def opened(self) -> None:
        """Its hello arrived."""

    def received(self, raw) -> bool:
        """Act on one message; True after the peer's last one."""
        raise NotImplementedError

    def closed(self) -> None:
        """Its connection ended (after its last message, or lost before it)."""


class _StreamPeer(_Peer):
    """A task or a supervisor: one-way reports until its last one, then it is gone. If
    the connection breaks before that, the peer was lost (`lost`)."""

    kind = ""
    reports: tuple[type, ...] = ()

    def __init__(self, state: JobState, link: Link, number: int, host: str):
        self.state, self.link, self.number, self.host = state, link, number, host
        self.finished = False

    def opened(self) -> None:
        stopping = self.state.connected(self.kind, self.number, self.link)
        if stopping:
            self.link.send(messages.encode(messages.Abort(stopping)))

    def received(self, raw) -> bool:
        try:
            report = messages.decode(raw, self.reports)
        except MalformedMessage as exc:
            logger.warning("%s %d sent %s", self.kind, self.number, exc)
            _reject(self.link, exc)
            return False
        self.finished = self.handle(report)
        return self.finished

    def closed(self) -> None:
        self.state.peers.remove(self.kind, self.number)
        if not self.finished:
            self.lost()

    def handle(self, report) -> bool:
        """Act on one report; True after the peer's last one."""
        raise NotImplementedError

    def lost(self) -> None:
        raise NotImplementedError


class _TaskStreams:
    """A task's local peers (`runner/task/relay.py`): each is a stream of the task's
    channel, served by the same handler a direct connection gets."""

    def __init__(self, service: DriverService, link: Link):
        self.service, self.link = service, link
        self.peers: dict[int, _Peer] = {}
        self.ended: set[int] = set()
        self.payload_sent = False
        """The relay got the payload: later ranks through it get theirs from it."""
        self.warm_payload_run = 0
        """The last warm run whose payload the relay got (`warm.WarmDispatch`)."""

    def received(self, stream: int, body) -> None:
        if stream in self.ended:
            return  # after its end (a peer that kept talking)
        peer = self.peers.get(stream)
        if peer is None:
            peer = self.service.greet(body, _StreamLink(self, stream), LOCAL_HELLOS)
            if peer is None:
                self._end(stream)
            else:
                self.peers[stream] = peer
        elif peer.received(body):
            self._end(stream)
            peer.closed()

    def closed(self, stream: int) -> None:
        """The relay says the stream's connection ended."""
        self.ended.add(stream)
        peer = self.peers.pop(stream, None)
        if peer is not None:
            peer.closed()

    def close_all(self) -> None:
        """The task's channel ended: so did every stream."""
        for stream in list(self.peers):
            self.closed(stream)

    def _end(self, stream: int) -> None:
        """The driver is done with the stream: the relay closes its connection."""
        self.ended.add(stream)
        self.peers.pop(stream, None)
        try:
            self.link.send(messages.encode(messages.RelayClosed(stream)))
        except OSError:
            pass


class _StreamLink:
    """How the driver sends to a task's local peer: through the task's channel."""

    def __init__(self, relay: _TaskStreams, stream: int):
        self.relay, self.stream = relay, stream

    def send(self, message) -> None:
        self.relay.link.send(messages.encode(messages.Relayed(self.stream, message)))


class _TaskPeer(_StreamPeer):
    """A barrier task: process records, its launcher's output and exit, and its local
    peers' streams."""

    kind = "task"
    reports = messages.TASK_REPORTS
    streams: _TaskStreams

    def closed(self) -> None:
        self.streams.close_all()
        super().closed()

    def handle(self, report) -> bool:
        match report:
            case messages.Relayed(stream, body):
                self.streams.received(stream, body)
            case messages.RelayClosed(stream):
                self.streams.closed(stream)
            case messages.ProcessStarted(record):
                self.state.processes.record(record)
            case messages.AgentPlace():
                self.state.agent_placed(self.number, report)
            case messages.LauncherOutput(lines):
                self.state.processes.launcher_output(lines)
            case messages.LauncherExit(name, code, rank):
                self.state.losses.launcher_exited(name, code, rank)
            case messages.TaskLost(index, host, detail):
                self.state.losses.task_lost_by(self.number, index, host, detail)
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

    def opened(self) -> None:
        self.state.rank_records.located(self.number, self.host)
        super().opened()

    def handle(self, report) -> bool:
        match report:
            case messages.ProcessStarted(record):
                self.state.processes.record(record)
            case messages.RankOutput(lines):
                self.state.life.seen(self.number)
                self.state.rank_records.output(self.number, lines)
            case messages.RankStacks(request, text, nccl):
                self.state.stacks.answered(self.number, request, text, nccl)
            case messages.RankExit(code, tail, passed_on):
                # A rank stopped because the job is stopping is no failure of its own.
                stopping = self.state.failures.stopping
                how = "exited" if not code else "stopped" if stopping else "failed"
                self.state.trace.rank_ended(self.number, how, f"exited with code {code}")
                self.state.losses.rank_exited(self.number, code, tail, passed_on)
                self.link.send(messages.encode(messages.Bye()))
                return True
        return False

    def lost(self) -> None:
        self.state.losses.supervisor_lost(self.number)


class _WherePeer(_Peer):
    """Asks where each rank is: answered once (the ranks' stacks are taken off the
    loop, `stalls.where`); nothing it sends after that is read."""

    def __init__(self, service: DriverService, link: Link, why: str):
        self.service, self.link, self.why = service, link, why

    def opened(self) -> None:
        stacks = functools.partial(where, self.service.state, self.why)
        self.service.offload(stacks, self._reply)

    def received(self, raw) -> bool:
        return True

    def _reply(self, text) -> None:
        reply = text if isinstance(text, messages.Failed) else messages.Ok(text)
        try:
            self.link.send(messages.encode(reply))
        except OSError:
            pass  # the asker gave up


class _CarrierPeer(_WherePeer):
    """A relayed warm world's run, carried from the client by a plain Spark task:
    answered once, when the run ended (`WarmDispatch.carry`, off the loop)."""

    def __init__(self, service: DriverService, link: Link, order: messages.WarmCarry):
        self.service, self.link, self.order = service, link, order

    def opened(self) -> None:
        warm = self.service.state.warm
        if warm is None or warm.carry is None:
            self._reply(messages.Failed("this job is not a relayed warm world"))
            return
        self.service.offload(functools.partial(warm.carry, self.order), self._reply)


class _RankPeer(_Peer):
    """A rank: its payload, then requests, each answered."""

    def __init__(self, service: DriverService, link: Link, hello: messages.RankHello):
        self.service, self.state, self.link = service, service.state, link
        self.rank, self.host = hello.rank, hello.host

    def opened(self) -> None:
        self.state.rank_records.started(self.rank, self.host)
        self._reply(self.service.welcome(self.rank, self.host, self.link))

    def received(self, raw) -> bool:
        try:
            request = messages.decode(raw, messages.RANK_REQUESTS)
        except MalformedMessage as exc:
            logger.warning("rank %d sent %s", self.rank, exc)
            self._reply(messages.Rejected(str(exc)))
            return False
        if isinstance(request, CHECKPOINT_REQUESTS):  # the job's store answers them
            self.state.life.seen(self.rank)
            stored = functools.partial(self.state.answer_checkpoint, self.rank)
            answer = functools.partial(self.state.checkpoints.answer, request, self._reader, stored)
            self.service.offload(answer, self._reply)
        elif isinstance(request, messages.KvGet):
            self._when_put(request.key, request.timeout_s)
        elif isinstance(request, messages.ElasticWorld):
            self._when_formed(request)
        elif isinstance(request, messages.WarmNext):
            self._when_run(request.after)
        else:
            self._reply(self._answer(request))
        return False

    def closed(self) -> None:
        self.state.checkpoints.unpin(self._reader)  # a rank gone reads no checkpoint

    def _reply(self, reply: tuple) -> None:
        try:
            self.link.send(messages.encode(reply))
        except OSError:
            pass  # the rank is gone: its connection's end says so

    def _when_put(self, key: str, timeout_s: float) -> None:
        """Answer a rendezvous read once its key is put, or after `timeout_s`."""
        answered = False

        def answer(found: bool, value) -> None:  # on the loop
            nonlocal answered
            if not answered:
                answered = True
                timer.cancel()
                self._reply(messages.Ok(value) if found else messages.Missing(key))

        timer = self.service.later(max(0.0, timeout_s), answer, False, None)
        self.state.rendezvous.when_put(key, functools.partial(self.service.on_loop, answer))

    def _when_formed(self, request: messages.ElasticWorld) -> None:
        """Answer an in-process elastic rank's request for a newer world generation at
        once if there is one, else once it forms (or `Missing` after `timeout_s`)."""
        if request.rank != self.rank:
            self._reply(messages.Failed(f"rank {self.rank} asked as rank {request.rank}"))
            return
        membership, missing = self.state.membership, messages.Missing(f"generation>{request.after}")
        if request.done:
            self._reply(membership.finish(self.rank, request.after) or missing)
            return
        if request.broke:  # its world broke: once every member says so, the next forms
            membership.broke(self.rank, request.after)
        if membership.wait is not None:  # below min_np it waits for slots: not stalled
            self.state.life.seen(self.rank)
        if request.timeout_s <= 0:
            self._reply(membership.ask(self.rank, request.after, None) or missing)
            return
        answered = False

        def answer(reply: tuple) -> None:  # on the loop
            nonlocal answered
            if not answered:
                answered = True
                timer.cancel()
                self._reply(reply)

        timer = self.service.later(request.timeout_s, answer, missing)
        now = membership.ask(
            self.rank, request.after, functools.partial(self.service.on_loop, answer)
        )
        if now is not None:
            answer(now)

    def _when_run(self, after: int) -> None:
        """A warm world's idle rank: answered with its next run when one comes."""
        warm = self.state.warm
        if warm is None:
            self._reply(messages.Rejected("this job is not a warm world"))
            return
        relay = self.link.relay if isinstance(self.link, _StreamLink) else None

        def send(order) -> None:  # on the loop: the payload once per task's relay
            if isinstance(order, messages.WarmRun):
                if relay is not None and relay.warm_payload_run == order.run:
                    order = order._replace(payload=b"")
                elif relay is not None:
                    relay.warm_payload_run = order.run
                warm.payload_bytes_sent += len(order.payload)
            self._reply(order)

        warm.next(self.rank, after, functools.partial(self.service.on_loop, send))

    def _answer(self, request) -> tuple:
        state, rank = self.state, self.rank
        match request:
            case messages.KvPut(key, value):
                state.rendezvous.put(key, value)
            case messages.Log(text):
                state.life.seen(rank)
                state.console.write("stdout", f"[rank {rank}] {text}")
            case messages.FileUpload(name, data):
                with state.cond:
                    state.files[name] = data
            case messages.Result(value, frameworks):
                state.trace.rank_ended(rank, "returned")
                state.rank_result(rank, value, frameworks)
            case messages.RankError(traceback, reason):
                state.trace.rank_ended(rank, "failed", reason)
                state.losses.rank_error(rank, traceback, reason)
            case messages.Report(step, metrics):
                return self._report(step, metrics)
            case messages.CheckpointDue():
                return messages.Ok(state.checkpoint_due())
            case messages.WarmDone() if state.warm is not None:
                state.life.seen(rank)
                state.warm.done(rank, request)
            case messages.Alive(counts, events):
                for kind, count in counts.items():
                    state.life.seen(rank, count, kind)
                if not counts and not any(event[0] == "main" for event in events):
                    state.life.seen(rank)  # the launch's end (`main_entered`) is sparkdist's
                state.trace.rank_events(rank, events)
        return messages.Ok()

    @property
    def _reader(self) -> tuple[str, int]:
        return (self.state.job.job_id, self.rank)

    def _report(self, step: int, metrics: dict) -> tuple:
        bad = [
            k
            for k, v in metrics.items()
            if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, float))
        ]
        if bad:
            return messages.Failed(f"metrics must map names to numbers; bad: {bad}")
        self.state.life.seen(self.rank, step + 1, "report")
        pruned = self.state.metrics.add(self.rank, step, metrics)
        return messages.Ok("prune" if pruned else None)
