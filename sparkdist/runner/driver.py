"""The driver's side of a job: one authenticated server that every task, supervisor
and rank talks to, and the job's state as those messages build it up.

Three kinds of peers connect, each saying first who it is:

* a Spark barrier task ("task"): reports the processes it started and how its
  launcher (mpirun) ended; the driver tells it when to finish or abort;
* a rank's supervisor ("supervisor"): streams the rank's output and its exit status;
* a rank itself ("rank"): fetches the payload, publishes and reads rendezvous values,
  sends back its result or its traceback, and `log_to_driver` messages.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, TextIO

from sparkdist.runner import wire
from sparkdist.runner.checkpoint_store import CheckpointStore
from sparkdist.runner.errors import (
    JobFailedError,
    JobTimeoutError,
    RankFailedError,
    describe_exit,
)
from sparkdist.runner.processes import ProcessRecord

logger = logging.getLogger(__name__)

TAIL_LINES = 40
# After a rank reports an exception, how long to wait for its exit status and last
# output lines before reporting the failure anyway.
FAILURE_SETTLE_S = 3.0


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
    tail: deque = field(default_factory=lambda: deque(maxlen=TAIL_LINES))


@dataclass
class Failure:
    rank: int | None
    reason: str | None
    noticed_at: float
    outside_user_code: bool = False
    """Lost executor or host, or a rank killed by SIGKILL: not the training code's doing."""


@dataclass
class JobSpec:
    """What the driver tells every rank when it says hello."""

    job_id: str
    np: int
    payload: bytes
    all_results: bool
    log_mode: str


class JobState:
    """Everything the driver knows about a running job; safe across handler threads."""

    def __init__(
        self,
        spec: JobSpec,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
        checkpoints: CheckpointStore | None = None,
    ):
        self.spec = spec
        self.checkpoints = checkpoints
        self.ranks = {r: RankState(r) for r in range(spec.np)}
        self.processes: list[ProcessRecord] = []
        self.files: dict[str, bytes] = {}
        self.launcher_tail: deque = deque(maxlen=TAIL_LINES)
        self.launcher_exit: int | None = None
        self.frameworks: list[str] = []
        self.tasks_started: set[int] = set()
        self.tasks_done: set[int] = set()
        self.tasks_lost: dict[int, str] = {}
        """Spark tasks whose agent connection broke before they finished, with why."""
        self._task_channels: dict[int, wire.Channel] = {}
        self._supervisor_channels: dict[int, wire.Channel] = {}
        self._kv: dict[str, Any] = {}
        self._failure: Failure | None = None
        self._noticed: list[Failure] = []
        self._stopping: str | None = None
        self._cond = threading.Condition()
        self._print_lock = threading.Lock()
        self._stdout = stdout
        self._stderr = stderr

    # --- messages -------------------------------------------------------------------

    def handle(self, channel: wire.Channel) -> None:
        """Serve one peer's channel until it closes (a `wire.Server` handler)."""
        hello = channel.recv()
        kind = hello[0]
        if kind == "task":
            self._serve_task(channel, hello[1], hello[2])
        elif kind == "supervisor":
            self._serve_supervisor(channel, hello[1], hello[2])
        elif kind == "rank":
            self._serve_rank(channel, hello[1], hello[2])
        else:
            logger.warning("ignoring a peer that introduced itself as %r", kind)

    def _serve_task(self, channel: wire.Channel, index: int, info: dict) -> None:
        with self._cond:
            self.tasks_started.add(index)
            self._task_channels[index] = channel
            stopping = self._stopping
        if stopping:
            channel.send(("abort", stopping))
        finished = False
        try:
            while True:
                message = channel.recv()
                kind = message[0]
                if kind == "process":
                    self.record(message[1])
                elif kind == "launcher_output":
                    self.launcher_output(message[1])
                elif kind == "launcher_exit":
                    self.launcher_exited(message[1], message[2])
                elif kind == "task_done":
                    finished = True
                    with self._cond:
                        self.tasks_done.add(index)
                        self._cond.notify_all()
                    return
        finally:
            with self._cond:
                self._task_channels.pop(index, None)
            if not finished:
                # Task i runs rank i (one rank per task, under both launchers).
                rank = index if index in self.ranks else None
                reason = (
                    f"lost contact with Spark task {index} on host {info.get('host')}: its "
                    "executor died, or the host or its network was lost"
                )
                with self._cond:
                    self.tasks_lost[index] = reason
                    if rank is not None and self.ranks[rank].host == "?":
                        self.ranks[rank].host = info.get("host", "?")
                self._notice_failure(rank, reason, outside_user_code=True)

    def _serve_supervisor(self, channel: wire.Channel, rank: int, info: dict) -> None:
        state = self.ranks[rank]
        with self._cond:
            state.host = info["host"]
            self._supervisor_channels[rank] = channel
            stopping = self._stopping
        if stopping:
            channel.send(("abort", stopping))
        try:
            while True:
                message = channel.recv()
                kind = message[0]
                if kind == "process":
                    self.record(message[1])
                elif kind == "output":
                    self._output(rank, message[1])
                elif kind == "exit":
                    self._rank_exited(rank, message[1], message[2])
                    channel.send(("bye",))
                    return
        finally:
            with self._cond:
                self._supervisor_channels.pop(rank, None)
                exited = state.exited
            if not exited:
                self._notice_failure(
                    rank,
                    f"lost contact with rank {rank} (its supervisor process died, or its host "
                    "or network was lost)",
                )

    def _serve_rank(self, channel: wire.Channel, rank: int, info: dict) -> None:
        state = self.ranks[rank]
        with self._cond:
            state.started = True
            state.host = info.get("host", state.host)
            self._cond.notify_all()
        spec = self.spec
        channel.send(
            {
                "payload": spec.payload,
                "send_result": spec.all_results or rank == 0,
                "job_id": spec.job_id,
            }
        )
        while True:
            message = channel.recv()
            kind = message[0]
            if kind == "put":
                with self._cond:
                    self._kv[message[1]] = message[2]
                    self._cond.notify_all()
                channel.send(("ok",))
            elif kind == "get":
                channel.send(self._kv_get(message[1], message[2]))
            elif kind == "log":
                self._print(f"[rank {rank}] {message[1]}", sys.stdout, self._stdout)
                channel.send(("ok",))
            elif kind == "file":
                with self._cond:
                    self.files[message[1]] = message[2]
                channel.send(("ok",))
            elif kind == "result":
                with self._cond:
                    state.result = message[1]
                    state.has_result = True
                    if rank == 0:
                        self.frameworks = message[2]
                    self._cond.notify_all()
                channel.send(("ok",))
            elif kind == "error":
                with self._cond:
                    state.traceback = message[1]
                self._notice_failure(rank, message[2])
                channel.send(("ok",))
            elif kind == "checkpoint_save":
                channel.send(self._checkpoint_save(message[1], message[2]))
            elif kind == "checkpoint_latest":
                store = self.checkpoints
                channel.send(("ok", store.latest() if store else None))

    # --- state changes ---------------------------------------------------------------

    def _checkpoint_save(self, step: int, blob: bytes) -> tuple:
        if self.checkpoints is None:
            return ("error", "this job has no checkpoint store")
        try:
            self.checkpoints.save(step, blob)
        except (OSError, ValueError) as exc:
            logger.warning("could not store checkpoint %s: %s", step, exc)
            return ("error", str(exc))
        return ("ok",)

    def record(self, record: ProcessRecord) -> None:
        with self._cond:
            if record not in self.processes:
                self.processes.append(record)

    def _kv_get(self, key: str, timeout_s: float) -> tuple[str, Any]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while key not in self._kv:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopping:
                    return ("missing", None)
                self._cond.wait(min(remaining, 0.5))
            return ("ok", self._kv[key])

    def _output(self, rank: int, lines: list[tuple[str, str]]) -> None:
        state = self.ranks[rank]
        with self._cond:
            state.tail.extend(line for _, line in lines)
        if self.spec.log_mode != "all":
            return
        for stream, line in lines:
            if stream == "stderr":
                self._print(f"[rank {rank}] {line}", sys.stderr, self._stderr)
            else:
                self._print(f"[rank {rank}] {line}", sys.stdout, self._stdout)

    def _print(self, text: str, default: TextIO, override: TextIO | None) -> None:
        # Rank output is the job's progress output: it goes to the driver's own
        # stdout/stderr so that a notebook cell shows it live.
        out = override or default
        with self._print_lock:
            out.write(text + "\n")
            out.flush()

    def launcher_output(self, lines: list[str]) -> None:
        with self._cond:
            self.launcher_tail.extend(lines)
        for line in lines:
            logger.debug("mpirun: %s", line)

    def fail(self, reason: str) -> None:
        """A failure seen outside the ranks (e.g. the Spark stage itself failed)."""
        self._notice_failure(None, reason)

    def launcher_exited(self, name: str, exit_code: int) -> None:
        """mpirun (or a direct launcher's supervisor process) ended."""
        with self._cond:
            if name == "mpirun":
                self.launcher_exit = exit_code
            self._cond.notify_all()
        if exit_code != 0:
            self._notice_failure(None, f"{name} exited with code {exit_code}")

    def _rank_exited(self, rank: int, exit_code: int, tail: list[str]) -> None:
        state = self.ranks[rank]
        with self._cond:
            state.exited = True
            state.exit_code = exit_code
            if tail:
                state.tail.extend(line for line in tail if line not in state.tail)
            self._cond.notify_all()
        if exit_code != 0:
            killed = exit_code == -signal.SIGKILL and state.traceback is None
            self._notice_failure(rank, None, outside_user_code=killed)

    def _notice_failure(
        self, rank: int | None, reason: str | None, outside_user_code: bool = False
    ) -> None:
        """Remember the first failure; later ones are consequences of it."""
        with self._cond:
            if self._stopping and self._failure is None:
                return  # the job is being stopped on purpose: losses are expected
            now = time.monotonic()
            failure = Failure(rank, reason, now, outside_user_code)
            if not self._stopping:
                self._noticed.append(failure)
            first = self._failure
            if first is None or (first.rank is None and rank is not None):
                # A rank's own failure explains a lost task or mpirun's exit better.
                if first is None or now - first.noticed_at < FAILURE_SETTLE_S:
                    self._failure = failure
            self._cond.notify_all()

    def failure_outside_user_code(self) -> str | None:
        """Why the job's failure was not the training code's doing, or None.

        Looks at every failure noticed until the job was stopped, because the first one
        reported can be a consequence: when a rank is killed, its peers' collectives
        raise at about the same moment as its death is reported. A Spark task lost at any
        time (its executor or host gone) counts, and so does a rank that died of a signal
        without raising when it was the first failure. Call it after the job stopped.
        """
        with self._cond:
            for failure in self._noticed:
                if failure.outside_user_code:
                    return self._describe(failure)
            if self.tasks_lost:
                # Noticed only while the job was being stopped (a host cut off is
                # noticed when its connections time out, later than its peers' errors).
                index = min(self.tasks_lost)
                return self._describe(Failure(index, self.tasks_lost[index], 0.0))
            first = self._failure
            if first is not None and first.rank is not None:
                state = self.ranks[first.rank]
                code = state.exit_code
                if state.traceback is None and code is not None and code < 0:
                    return self._describe(first)
            return None

    def note_outside_failure(self, reason: str) -> None:
        """A failure outside the training code that was seen elsewhere (a relayed job's
        task 0), so that `failure_outside_user_code` reports it here too."""
        with self._cond:
            self._noticed.append(Failure(None, reason, time.monotonic(), True))

    def _describe(self, failure: Failure) -> str:
        if failure.rank is None:
            return failure.reason or "unknown"
        state = self.ranks[failure.rank]
        if failure.reason:
            return f"rank {failure.rank} on host {state.host}: {failure.reason}"
        return (
            f"rank {failure.rank} on host {state.host} ended with {describe_exit(state.exit_code)}"
        )

    # --- the driver's view -----------------------------------------------------------

    def succeeded(self) -> bool:
        needed = self.ranks.values() if self.spec.all_results else [self.ranks[0]]
        return (
            all(s.exited and s.exit_code == 0 for s in self.ranks.values())
            and all(s.has_result for s in needed)
            and self.launcher_exit in (None, 0)
        )

    def _failure_ready(self) -> bool:
        failure = self._failure
        if failure is None:
            return False
        settled = time.monotonic() - failure.noticed_at >= FAILURE_SETTLE_S
        if failure.rank is None:
            return settled
        return self.ranks[failure.rank].exited or settled

    def wait(self, start_deadline: float | None, deadline: float | None, launcher_expected: bool):
        """Block until success, the first failure, or a time limit; raise on the latter two."""
        with self._cond:
            while True:
                if self._failure_ready():
                    raise self._failure_error()
                if self.succeeded() and (not launcher_expected or self.launcher_exit == 0):
                    return
                now = time.monotonic()
                if start_deadline and now > start_deadline and not self._all_started():
                    raise self._start_timeout_error()
                if deadline and now > deadline:
                    raise self._timeout_error()
                self._cond.wait(0.2)

    def _all_started(self) -> bool:
        return all(s.started for s in self.ranks.values())

    def _failure_error(self) -> JobFailedError:
        failure = self._failure
        assert failure is not None
        if failure.rank is None:
            return JobFailedError(failure.reason or "unknown", list(self.launcher_tail))
        state = self.ranks[failure.rank]
        tail = list(state.tail)
        if state.traceback:
            # The rank also printed its traceback; show it once.
            printed = set(state.traceback.splitlines())
            tail = [line for line in tail if line not in printed]
        reason = failure.reason
        if state.traceback is None and failure.rank in self.tasks_lost:
            # The rank's task was lost too: its executor (or host) is the better explanation.
            reason = self.tasks_lost[failure.rank]
        return RankFailedError(
            rank=state.rank,
            host=state.host,
            exit_code=state.exit_code,
            traceback=state.traceback,
            output_tail=tail,
            reason=reason,
        )

    def _start_timeout_error(self) -> JobTimeoutError:
        missing = [r for r, s in self.ranks.items() if not s.started]
        return JobTimeoutError(
            f"start timeout: ranks {missing} of {self.spec.np} had not started; "
            f"Spark tasks started: {sorted(self.tasks_started)}. The cluster may lack free "
            "task slots for a barrier stage of this size (other jobs running?), or rank "
            "start-up is slow: raise HorovodRunner(start_timeout=...)." + self._tails(missing)
        )

    def _timeout_error(self) -> JobTimeoutError:
        running = [r for r, s in self.ranks.items() if not s.exited]
        return JobTimeoutError(
            f"timeout: ranks {running} were still running when the job's time limit ran "
            "out; the job was stopped." + self._tails(running)
        )

    def _tails(self, ranks: list[int]) -> str:
        parts = []
        for rank in ranks:
            tail = list(self.ranks[rank].tail)[-10:]
            if tail:
                parts.append(f"\nLast lines of rank {rank}:\n" + "\n".join(f"  {t}" for t in tail))
        return "".join(parts)

    def results(self) -> list[bytes | None]:
        return [self.ranks[r].result for r in range(self.spec.np)]

    def stop(self, how: str, reason: str) -> None:
        """Tell every task and supervisor to finish (`how="finish"`) or abort."""
        with self._cond:
            if how == "abort":
                self._stopping = reason
            channels = list(self._task_channels.values())
            if how == "abort":
                channels += list(self._supervisor_channels.values())
        for channel in channels:
            try:
                channel.send((how, reason))
            except OSError:
                pass

    def wait_tasks_done(self, count: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while len(self.tasks_done) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, 0.2))
        return True


class DriverService:
    """The job's server on the driver, bound where the executors can reach it."""

    def __init__(self, state: JobState, secret: bytes, bind_host: str, advertise_host: str):
        self.state = state
        self._server = wire.Server(secret, state.handle, host=bind_host, name="sparkdist-driver")
        self.address = (advertise_host, self._server.address[1])

    def close(self) -> None:
        self._server.close()
