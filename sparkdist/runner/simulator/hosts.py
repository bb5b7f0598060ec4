"""The simulated hosts of one simulator worker process: each is one Spark task with its
ranks' supervisors and ranks, and each of them speaks the real protocol to the driver's
real service (`wire.connect`: TLS and the HMAC handshake; the records of
`protocol.messages`), one phase at a time as the simulator's coordinator orders
(`serve`). Blocking channels on a pool of threads, as the real peers use; what the
driver sends this process is counted as it arrives (`ByteCount`).

A simulated host gives its supervisors and ranks an address to reach the driver at
(`SimulatedHost.address`): the driver's own today. A per-task relay would give its own
address there instead, and the rest stays as it is.

Imports nothing of the driver's process, as a real task or rank does not.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from sparkdist.network import split_address
from sparkdist.protocol import messages, wire
from sparkdist.protocol.processes import ProcessRecord
from sparkdist.runner.task.relay import HostRelay

POOL_THREADS = 32
"""Threads per worker process that run the simulated peers' blocking calls."""
LARGE_PAYLOAD = 16 << 20
LARGE_IN_FLIGHT = 2
"""Fetches of a large payload in flight at once per worker process, so that a 100 MB
payload to 1,024 ranks does not hold hundreds of copies on this shared machine."""
BATCH_LINES = 500
"""At most this many lines per `RankOutput`, as the real supervisor sends them."""
TICK_S = 0.1
"""Lines streamed at a rate go out in batches this often."""
MASTER_KEY = "simulated-master"
FAKE_PIDS = 1 << 23
"""Above any Linux pid: the processes the simulated supervisors report do not exist."""


@dataclass(frozen=True)
class WorkerPlan:
    """What one worker process needs: where the driver is, the job's secret (a task's
    copy, as Spark tasks get it) and which simulated hosts it holds."""

    driver: tuple[str, int]
    secret: wire.JobSecret
    hosts: tuple[int, ...]
    ranks_per_host: int


@dataclass(frozen=True)
class LinePlan:
    """The lines each rank's supervisor streams: `count` per rank, at `rate` lines a
    second (None: as fast as they go), and one `error` line of `error_rank` halfway."""

    count: int
    rate: float | None = None
    error_rank: int | None = None
    error: str = ""


def host_name(index: int) -> str:
    return f"sim-host-{index}"


class ByteCount:
    """The bytes this process received from the driver: what the driver sent it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = 0

    def add(self, count: int) -> None:
        with self._lock:
            self.total += count


class _CountedSocket:
    """A channel's socket that counts what it receives (`wire.Channel` reads with `recv`
    and `recv_into` only)."""

    def __init__(self, sock, count: ByteCount):
        self._sock, self._count = sock, count

    def recv(self, size: int) -> bytes:
        data = self._sock.recv(size)
        self._count.add(len(data))
        return data

    def recv_into(self, buffer, size: int = 0) -> int:
        received = self._sock.recv_into(buffer, size)
        self._count.add(received)
        return received

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def _send(channel: wire.Channel, message) -> None:
    channel.send(messages.encode(message))


def _request(channel: wire.Channel, message, expected: type) -> Any:
    reply = messages.reply_to(channel.request(messages.encode(message)), messages.RANK_REPLIES)
    if not isinstance(reply, expected):
        raise RuntimeError(f"the driver answered {type(message).__name__} with {reply}")
    return reply


def _order(channel: wire.Channel, orders: tuple[type, ...], expected: type) -> None:
    order = messages.decode(channel.recv(), orders)
    if not isinstance(order, expected):
        raise RuntimeError(f"the driver sent {order}, not {expected.__name__}")


class SimulatedHost:
    """One simulated Spark task and its ranks: the task's channel, and each rank's
    supervisor's channel and its own, opened and used as the real processes do."""

    def __init__(self, index: int, plan: WorkerPlan, count: ByteCount):
        self.index = index
        self.name = host_name(index)
        self.plan = plan
        self.count = count
        self.address = plan.driver
        """Where this host's supervisors and ranks reach the driver: its task's relay."""
        first = index * plan.ranks_per_host
        self.ranks = range(first, first + plan.ranks_per_host)
        self.task: wire.Channel | None = None
        self.supervisors: dict[int, wire.Channel] = {}
        self.rank_channels: dict[int, wire.Channel] = {}
        self.tails: dict[int, list[str]] = {}
        self.stopped = threading.Event()
        """Set when the driver told the task to finish or abort (`order`), or went away."""
        self.order: messages.Finish | messages.Abort | None = None

    def _connect(self, address: tuple[str, int]) -> wire.Channel:
        """A channel to `address`; what the driver sends on it is counted."""
        channel = wire.connect(address, self.plan.secret)
        if address == self.plan.driver:
            channel.sock = _CountedSocket(channel.sock, self.count)
        return channel

    def start_task(self) -> None:
        self.task = self._connect(self.plan.driver)
        _send(self.task, messages.TaskHello(self.index, self.name, os.getpid()))
        self.relay = HostRelay(self.plan.secret, lambda record: _send(self.task, record))
        self.address = split_address(self.relay.address)
        threading.Thread(target=self._listen, name=f"{self.name}-task", daemon=True).start()

    def _listen(self) -> None:
        """The driver's orders to the task, as `TaskRun._listen` reads them."""
        try:
            while True:
                order = messages.decode(self.task.recv(), messages.TASK_ORDERS)
                if isinstance(order, messages.RELAY_FRAMES):
                    self.relay.deliver(order)
                    continue
                if isinstance(order, (messages.Finish, messages.Abort)):
                    self.order = order
                    break
        except (EOFError, OSError, wire.AuthenticationError, messages.MalformedMessage):
            self.order = None
        self.stopped.set()

    def start_rank(self, rank: int, gate: contextlib.AbstractContextManager) -> None:
        """The rank's supervisor says hello and reports its processes; the rank says
        hello, gets its `Welcome` and meets the others through the rendezvous store."""
        supervisor = self.supervisors[rank] = self._connect(self.address)
        _send(supervisor, messages.SupervisorHello(rank, self.name, os.getpid()))
        for offset, role in enumerate(("supervisor", "rank")):
            record = ProcessRecord(self.name, FAKE_PIDS + 2 * rank + offset, role, 0.0)
            _send(supervisor, messages.ProcessStarted(record))
        channel = self.rank_channels[rank] = self._connect(self.address)
        with gate:  # a large payload: a few at a time
            hello = messages.RankHello(rank, self.name, os.getpid())
            _request(channel, hello, messages.Welcome)  # its payload dropped at once
        if rank == 0:
            _request(channel, messages.KvPut(MASTER_KEY, f"{self.name}:29500"), messages.Ok)
        _request(channel, messages.KvGet(MASTER_KEY, 60.0), messages.Ok)

    def output(self, rank: int, first: int, last: int, lines: LinePlan) -> None:
        """Rank `rank`'s lines `first` to `last - 1`, from its supervisor."""
        batch = [("stdout", f"rank {rank} step {i}") for i in range(first, last)]
        if rank == lines.error_rank and first <= lines.count // 2 < last:
            batch.insert(lines.count // 2 - first, ("stderr", lines.error))
        self.tails[rank] = (self.tails.get(rank, []) + [text for _, text in batch])[-40:]
        for start in range(0, len(batch), BATCH_LINES):
            _send(self.supervisors[rank], messages.RankOutput(batch[start : start + BATCH_LINES]))

    def finish_rank(self, rank: int) -> None:
        """The rank sends its result and ends; its supervisor reports a clean exit."""
        channel = self.rank_channels.pop(rank)
        _request(channel, messages.Result(pickle.dumps(rank), []), messages.Ok)
        channel.close()
        supervisor = self.supervisors.pop(rank)
        _send(supervisor, messages.RankExit(0, self.tails.get(rank, [])))
        _order(supervisor, messages.ORDERS, messages.Bye)
        supervisor.close()

    def finish_task(self) -> None:
        """The driver says finish; the task says it is done, nothing left behind."""
        if not self.stopped.wait(60) or not isinstance(self.order, messages.Finish):
            raise RuntimeError(f"task {self.index} got {self.order}, not Finish")
        self.relay.close()
        _send(self.task, messages.TaskDone([]))
        self.task.close()


class Phases:
    """The phases the coordinator orders, each run over every host of this process."""

    def __init__(self, hosts: list[SimulatedHost], pool: ThreadPoolExecutor):
        self.hosts = hosts
        self.pool = pool
        self._ranks = [(host, rank) for host in hosts for rank in host.ranks]

    def _each(self, items: Iterable, call: Callable) -> None:
        for _ in self.pool.map(lambda item: call(*item), items):
            pass

    def form(self, payload: int) -> None:
        """Tasks, then every rank (rank 0 first: it puts the key the others read)."""
        large = payload >= LARGE_PAYLOAD
        gate = threading.BoundedSemaphore(LARGE_IN_FLIGHT) if large else contextlib.nullcontext()
        self._each([(h,) for h in self.hosts], SimulatedHost.start_task)
        self._each(self._ranks, lambda host, rank: host.start_rank(rank, gate))

    def lines(self, lines: LinePlan) -> None:
        """Every supervisor streams its rank's lines, in ticks when at a rate."""
        per_tick = lines.count if lines.rate is None else max(1, int(lines.rate * TICK_S))
        start = time.monotonic()
        for tick, first in enumerate(range(0, lines.count, per_tick)):
            if lines.rate is not None:
                time.sleep(max(0.0, start + tick * TICK_S - time.monotonic()))  # the rate
            last = min(first + per_tick, lines.count)
            for host, rank in self._ranks:
                host.output(rank, first, last, lines)

    def results(self) -> None:
        self._each(self._ranks, SimulatedHost.finish_rank)

    def finish(self) -> None:
        self._each([(h,) for h in self.hosts], SimulatedHost.finish_task)


def serve(conn: Connection, plan: WorkerPlan) -> None:
    """A worker process's main: run each phase the coordinator orders (`(name, args)`),
    answer `("done", bytes the driver sent meanwhile)` or `("failed", traceback)`."""
    count = ByteCount()
    hosts = [SimulatedHost(index, plan, count) for index in plan.hosts]
    with ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="simulated") as pool:
        phases = Phases(hosts, pool)
        conn.send(("ready", 0))
        while True:
            name, args = conn.recv()
            if name == "quit":
                return
            before = count.total
            try:
                getattr(phases, name)(*args)
            except Exception:  # noqa: BLE001 - the coordinator raises it
                conn.send(("failed", traceback.format_exc()))
                continue
            conn.send(("done", count.total - before))
