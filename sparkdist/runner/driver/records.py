"""The parts of what the driver knows about a running job, as plain records, one concern
each: each rank's record (`RankRecords`), the Spark tasks (`SparkTasks`), the processes
started and the launcher's end (`Processes`), the open channels (`Peers`), an elastic
job's growth (`Growth`) and the key-value store the ranks' rendezvous use
(`RendezvousStore`). What the job is (`JobSpec`) is `job_spec.py`'s, with how it ended.

Each part changes only itself, under the job's one lock (`JobState.cond`; the rendezvous
store keeps its own). What touches several parts is `job_state.JobState`'s, and how the
end of a process becomes the job's failure is `failures.py`'s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from sparkdist.protocol import messages
from sparkdist.protocol.processes import ProcessRecord
from sparkdist.runner.driver.console import Console

logger = logging.getLogger(__name__)


@dataclass
class RankState:
    """One rank's record: where it runs, whether it started, its output's last lines
    (for error messages), its result or traceback, and how it ended."""

    rank: int
    host: str = "?"
    started: bool = False
    exit_code: int | None = None
    exited: bool = False
    traceback: str | None = None
    result: bytes | None = None
    has_result: bool = False
    tail: deque = field(default_factory=lambda: deque(maxlen=messages.TAIL_LINES))


class RankRecords:
    """The records of a job's ranks, filled from their messages under the job's lock."""

    def __init__(self, num_ranks: int, cond: threading.Condition, console: Console, log_mode: str):
        self.cond = cond
        self.by_rank = {r: RankState(r) for r in range(num_ranks)}
        self.initial = num_ranks
        """The ranks the attempt started with (0..initial-1); an in-process elastic
        world's newcomers come after them (`add`)."""
        self.frameworks: list[str] = []
        """The frameworks rank 0's function used (its `Result` says which)."""
        self._console = console
        self._log_mode = log_mode

    def located(self, rank: int, host: str) -> None:
        """The rank's supervisor connected from `host`."""
        with self.cond:
            self.by_rank[rank].host = host

    def started(self, rank: int, host: str) -> None:
        with self.cond:
            self.by_rank[rank].started = True
            self.by_rank[rank].host = host
            self.cond.notify_all()

    def output(self, rank: int, lines: list[tuple[str, str]]) -> None:
        """Lines the rank printed: kept for error messages, shown with `log_mode="all"`."""
        with self.cond:
            self.by_rank[rank].tail.extend(line for _, line in lines)
        if self._log_mode == "all":
            for stream, line in lines:
                self._console.write(stream, f"[rank {rank}] {line}")

    def result(self, rank: int, value: bytes, frameworks: list[str]) -> None:
        with self.cond:
            self.by_rank[rank].result = value
            self.by_rank[rank].has_result = True
            if rank == 0:
                self.frameworks = frameworks
            self.cond.notify_all()

    def error(self, rank: int, traceback: str) -> None:
        with self.cond:
            self.by_rank[rank].traceback = traceback

    def exited(self, rank: int, exit_code: int, tail: list[str]) -> None:
        """The rank's process ended; `tail` is its last lines as its supervisor saw them."""
        state = self.by_rank[rank]
        with self.cond:
            state.exited = True
            state.exit_code = exit_code
            if tail:
                state.tail.extend(line for line in tail if line not in state.tail)
            self.cond.notify_all()

    def add(self, ranks: Iterable[int]) -> None:
        """Records for the newcomers an in-process elastic world seated."""
        with self.cond:
            for rank in ranks:
                self.by_rank[rank] = RankState(rank)

    def all_started(self) -> bool:
        """Whether the attempt's first ranks started (newcomers have no start deadline:
        the world runs on without one that never starts)."""
        return not self.not_started()

    def not_started(self) -> list[int]:
        return [r for r in range(self.initial) if not self.by_rank[r].started]

    def running(self) -> list[int]:
        return [r for r, s in self.by_rank.items() if not s.exited]

    def succeeded(self, needed: Iterable[int], tolerated: set[int]) -> bool:
        """Every rank exited with 0 or is `tolerated` (the job goes on without it, ended
        or not: a lost worker, a rank an in-process world left behind or has not taken in
        yet), and the `needed` ranks sent their results."""
        return all(
            (s.exited and s.exit_code == 0) or r in tolerated for r, s in self.by_rank.items()
        ) and all(self.by_rank[r].has_result for r in needed)

    def tails(self, ranks: list[int]) -> str:
        """The last lines of each of `ranks`, for an error message."""
        parts = []
        for rank in ranks:
            tail = list(self.by_rank[rank].tail)[-10:]
            if tail:
                parts.append(f"\nLast lines of rank {rank}:\n" + "\n".join(f"  {t}" for t in tail))
        return "".join(parts)

    def results(self) -> list[bytes | None]:
        return [self.by_rank[r].result for r in range(len(self.by_rank))]


class SparkTasks:
    """A job's Spark tasks as the driver sees them: which connected, which said they were
    done, which were lost (and why), and where each task's agent listens."""

    def __init__(self, num_tasks: int, cond: threading.Condition):
        self.cond = cond
        self.num_tasks = num_tasks
        self.started: set[int] = set()
        self.done: set[int] = set()
        self.lost: dict[int, str] = {}
        """Tasks whose agent connection broke before they finished, with why."""
        self.places: dict[int, messages.AgentPlace] = {}
        self.spark_ids: dict[int, int] = {}
        """Each task's Spark task attempt id, where it said (its executor's notices)."""

    def identified(self, index: int, spark_task_id: int) -> None:
        """Task `index` is Spark's task attempt `spark_task_id` (-1: it did not say)."""
        if spark_task_id >= 0:
            with self.cond:
                self.spark_ids[index] = spark_task_id

    def connected(self, index: int) -> None:
        with self.cond:
            self.started.add(index)

    def finished(self, index: int) -> None:
        """Task `index` said it was done."""
        with self.cond:
            self.done.add(index)
            self.cond.notify_all()

    def lost_contact(self, index: int, reason: str) -> None:
        with self.cond:
            self.lost[index] = reason

    def placed(self, index: int, place: messages.AgentPlace) -> list[messages.AgentPlace] | None:
        """Task `index`'s agent listens at `place`; every task's place, in task order,
        once all are known."""
        with self.cond:
            self.places[index] = place
            if sorted(self.places) != list(range(self.num_tasks)):
                return None
            return [self.places[i] for i in range(self.num_tasks)]

    def live_count(self) -> int:
        """How many tasks connected and were not lost: those whose end to await."""
        with self.cond:
            return len(self.started - self.lost.keys())

    def wait_done(self, count: int, timeout_s: float) -> bool:
        """Whether `count` tasks said they were done within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while len(self.done) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.cond.wait(min(remaining, 0.2))
        return True


class Processes:
    """The processes a job reported starting (stopped when it ends, listed in its
    report), and its launcher's end: mpirun's (or a direct launcher's supervisor
    process's) last output lines and exit code."""

    def __init__(self, cond: threading.Condition):
        self.cond = cond
        self._started: list[ProcessRecord] = []
        self.launcher_tail: deque = deque(maxlen=messages.TAIL_LINES)
        self.launcher_exit_code: int | None = None
        """mpirun's exit code once it ended (a direct launcher's is not kept)."""

    def record(self, record: ProcessRecord) -> None:
        with self.cond:
            if record not in self._started:
                self._started.append(record)

    def started(self) -> list[ProcessRecord]:
        """Every process the job reported starting, so far."""
        with self.cond:
            return list(self._started)

    def launcher_output(self, lines: list[str]) -> None:
        with self.cond:
            self.launcher_tail.extend(lines)
        for line in lines:
            logger.debug("mpirun: %s", line)

    def launcher_exited(self, name: str, exit_code: int) -> None:
        with self.cond:
            if name == "mpirun":
                self.launcher_exit_code = exit_code
            self.cond.notify_all()


Peer = tuple[str, int]
"""("task", index) or ("supervisor", rank)."""


class Link(Protocol):
    """How the driver sends to one peer: its own channel, or its stream through its
    task's channel (`runner/task/relay.py`). Safe from any thread; raises OSError once
    the peer is gone."""

    def send(self, message: Any) -> None: ...


class Peers:
    """The open links from the driver to a job's tasks and rank supervisors."""

    def __init__(self, cond: threading.Condition):
        self.cond = cond
        self._channels: dict[Peer, Link] = {}

    def add(self, kind: str, number: int, channel: Link) -> None:
        with self.cond:
            self._channels[(kind, number)] = channel

    def remove(self, kind: str, number: int) -> None:
        with self.cond:
            self._channels.pop((kind, number), None)

    def channel(self, kind: str, number: int) -> Link | None:
        with self.cond:
            return self._channels.get((kind, number))

    def select(self, wanted: Callable[[str, int], bool]) -> list[Link]:
        """The channels of the peers `wanted(kind, number)` picks."""
        with self.cond:
            return [c for (kind, number), c in self._channels.items() if wanted(kind, number)]


def send(channels: Iterable[Link], order: NamedTuple) -> None:
    """Send `order` (`Finish`, `Abort`, every task's agent place) to each channel; a peer
    gone already is skipped (its loss is reported by its own handler)."""
    data = messages.encode(order)
    for channel in channels:
        try:
            channel.send(data)
        except OSError:
            pass


class Growth:
    """An elastic job's growth: when more slots stay free (`launch/gang_kind.py` decides),
    rank 0 is asked to stop at its next checkpoint, so that the job relaunches larger
    and resumes from there (`failures.WorldResize` ends the attempt); an in-process
    world takes the request instead and grows as it runs (`failures.WorldChange`)."""

    def __init__(self, cond: threading.Condition):
        self.cond = cond
        self.reason: str | None = None
        """Why the world should grow, once it should."""
        self.resizing: str | None = None
        """Rank 0 was told to stop after its checkpoint, so the job can grow: why."""
        self.leave = False
        """The request is to leave an executor being decommissioned (`notices.py`)."""

    def request(self, reason: str, leave: bool = False) -> None:
        """Ask rank 0 to stop at its next checkpoint, so the job relaunches larger (or,
        `leave`, without an executor being decommissioned: that request wins)."""
        with self.cond:
            if leave or not self.leave:
                self.reason, self.leave = reason, leave

    def take(self) -> str:
        """The request, taken by an in-process world, which grows without a relaunch
        (`membership.py`); a later request may follow."""
        with self.cond:
            reason, self.reason, self.leave = self.reason, None, False
            return reason or ""

    def answer_checkpoint(self, rank: int, step: int) -> str | None:
        """After rank `rank` stored checkpoint `step`: "grow" when the job should stop
        there to grow (rank 0 then ends), else None."""
        with self.cond:
            if rank != 0 or self.reason is None or self.resizing is not None:
                return None
            self.resizing = f"{self.reason}; resuming from step {step}"
            return "grow"


class RendezvousStore:
    """The job's key-value rendezvous store: frameworks exchange start-up values through
    it (rank 0's TCPStore port, Horovod's or TensorFlow's cluster addresses). Keys are
    put once and read by any rank; a read waits for its key (`when_put`) without holding
    a thread: its answer comes when the key is put or the store closes, and its reader
    bounds the wait with a timer of its own."""

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}
        self._waiting: dict[str, list[Answer]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def put(self, key: str, value: Any) -> None:
        with self._lock:
            self._values[key] = value
            waiting = self._waiting.pop(key, [])
        for answer in waiting:
            answer(True, value)

    def when_put(self, key: str, answer: Answer) -> None:
        """`answer(True, value)` once `key` is there (at once if it is), or
        `answer(False, None)` once the store is closed (the job is being stopped)."""
        with self._lock:
            if key not in self._values and not self._closed:
                self._waiting.setdefault(key, []).append(answer)
                return
            found = key in self._values
        answer(found, self._values.get(key))

    def close(self) -> None:
        """Answer every waiting read: the job is stopping."""
        with self._lock:
            self._closed = True
            waiting = [a for answers in self._waiting.values() for a in answers]
            self._waiting.clear()
        for answer in waiting:
            answer(False, None)


Answer = Callable[[bool, Any], None]
"""How a rendezvous read is answered: (found, value)."""
