"""A rank's supervisor: the process mpirun (or a task) starts for each rank.

It starts the rank's Python process, streams the rank's stdout and stderr to the
driver line by line, and reports how the rank ended, even when it was killed by a
signal and could report nothing itself (the driver's `KillRank` among them: a rank an
in-process elastic world drops, stopped or stuck). A SIGTERM it receives goes on to the rank.
In a relayed job, cut off from its task (its parent gone, or the channel), it leaves
its rank's stacks on its host for the client before it stops the rank
(`protocol/left_stacks.py`).
It stays small (no framework imports) so that it starts in milliseconds.

Run as `python -m sparkdist.runner.rank.supervisor`; everything it needs comes in the
environment (`job_environment`, and Open MPI's `OMPI_COMM_WORLD_*` under mpirun).
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping

from sparkdist import job_environment, native_logs, roles
from sparkdist.errors import exit_status
from sparkdist.job_environment import TaskEnvironment, rank_layout, take_secret
from sparkdist.network import split_address
from sparkdist.protocol import left_stacks, messages, wire
from sparkdist.protocol.job_secret import JobSecret
from sparkdist.protocol.processes import (
    ProcessRecord,
    die_with_parent,
    popen_group,
    signal_group,
    stop_group,
)
from sparkdist.protocol.stack_dumps import StackTaker

BATCH_LINES = 500
PARENT_DEATH_SIGNAL = signal.SIGHUP
"""A relayed job's supervisor's parent-death signal (SIGKILL otherwise): it is caught
once the rank runs (until then it ends the supervisor, as SIGKILL would)."""
TERM_GRACE_S = 10.0


def rank_in_own_session(env: Mapping[str, str]) -> bool:
    """Whether the rank gets a session of its own: as its framework's launcher does.

    Linux's autogroup scheduler shares the CPU between sessions first. torchrun and
    `horovodrun --gloo` start every worker in a session of its own; mpirun's ranks
    stay in one session with orted. Measured here (2 ranks, 4 MB allreduces): Horovod's
    MPI controller, whose threads busy-poll, fell from 3.5 to 0.2-1 GB/s in a third of
    the jobs when its ranks had sessions of their own, and torch's Gloo allreduce lost
    7% when its ranks shared one.
    """
    launcher = env.get(job_environment.LAUNCHER, job_environment.DEFAULT_LAUNCHER)
    return launcher == "direct"


class Supervisor:
    def __init__(self, env: Mapping[str, str]):
        self.env = dict(env)
        self.secret = JobSecret.from_text(take_secret(self.env))
        self.place = TaskEnvironment.from_env(self.env, self.secret, socket.gethostname())
        self.layout = rank_layout(self.env)
        self.rank = int(self.layout["RANK"])
        self.host = self.place.task_host
        self.stream_output = self.place.job.log_mode == "all"
        self.quiet = native_logs.below_level(self.env)  # C++ start-up logs, off by default
        self.tail: deque[str] = deque(maxlen=messages.TAIL_LINES)
        self.lines: queue.Queue = queue.Queue()
        self.bye = threading.Event()
        self.finished = threading.Event()
        """A server rank (parameter-server job) that the driver stopped: its chief is done."""
        self.role = roles.rank_role({**self.env, **self.layout})
        self.child = None
        self.stacks = StackTaker(self.env)  # answers the driver's requests for stacks
        self.leave_prefix = self.env.get(job_environment.LEFT_STACKS)
        self._cut_lock = threading.Lock()
        self._cut_thread: threading.Thread | None = None
        self._leave_lock = threading.Lock()  # held while the rank's stacks are left
        self._left = False  # this rank's stacks were left on the host
        self._rank_ended = threading.Event()
        self.passed_on = False  # the rank was sent a SIGTERM this process got
        self.channel = wire.connect(split_address(self.place.job.driver), self.secret)

    def _send(self, message) -> None:
        self.channel.send(messages.encode(message))

    def run(self) -> int:
        self._send(messages.SupervisorHello(self.rank, self.host, os.getpid()))
        self._send(messages.ProcessStarted(ProcessRecord.of(os.getpid(), "supervisor", self.host)))
        threading.Thread(target=self._listen, daemon=True).start()

        child_env = dict(self.env)
        child_env.update(self.layout)
        child_env[job_environment.SECRET] = self.secret.to_text()
        child_env[job_environment.SUPERVISOR_PID] = str(os.getpid())
        child_env["PYTHONUNBUFFERED"] = "1"
        child_env.update(self.stacks.rank_env(child_env))
        self.child = popen_group(
            [sys.executable, "-m", "sparkdist.runner.rank.main"],
            child_env,
            tie_to_parent=False,  # the rank sets its own parent-death signal
            new_session=rank_in_own_session(self.env),
            stdin=open(os.devnull, "rb"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        signal.signal(signal.SIGTERM, self._pass_on_sigterm)
        if self.leave_prefix:
            signal.signal(PARENT_DEATH_SIGNAL, self._on_parent_death)
        self._send(messages.ProcessStarted(ProcessRecord.of(self.child.pid, "rank", self.host)))
        readers = [
            threading.Thread(target=self._read, args=(self.child.stdout, "stdout"), daemon=True),
            threading.Thread(target=self._read, args=(self.child.stderr, "stderr"), daemon=True),
        ]
        for reader in readers:
            reader.start()
        batches = (self.lines, lambda batch: self._send(messages.RankOutput(batch)))
        sender = threading.Thread(target=send_in_batches, args=batches, daemon=True)
        sender.start()

        exit_code = self.child.wait()
        self._rank_ended.set()
        if self._cut_thread is not None:
            self._cut_thread.join()  # it ends this process
        # Whatever the rank left behind in its process group goes with it.
        stop_group(self.child, grace_s=1.0)
        if self.finished.is_set():
            exit_code = 0
        for reader in readers:
            reader.join(timeout=5)
        self.lines.put(None)
        sender.join(timeout=5)
        self._send(messages.RankExit(exit_code, list(self.tail), self.passed_on))
        self.bye.wait(timeout=10)
        self.channel.close()
        self.stacks.close()
        if self.role is not None and self.role[0] == "worker":
            # The driver decides whether the job survives a lost worker (it does while
            # another worker is left); a non-zero exit here would make mpirun end it.
            return 0
        return exit_status(exit_code)

    def _pass_on_sigterm(self, signum, frame) -> None:
        """SIGTERM (an operator, a host being decommissioned, orted ending the job) goes
        to the rank, which may stop cleanly (save a checkpoint); its end says the signal was
        passed on, not its code's doing. A rank still running TERM_GRACE_S later is killed."""
        self.passed_on = True
        if self._cut_thread is not None:
            return  # cut off already: the rank stops once its stacks are taken
        if self.leave_prefix:  # relay mode: the stage may be ending (cancelled, orted)
            threading.Thread(target=self._leave_then_terminate, name="sparkdist-term").start()
            return
        terminate_group(self.child.pid)

    def _leave_then_terminate(self) -> None:
        """A relayed job's rank told to stop while it runs: its stacks first (the client
        collects them if the stage was cancelled; stale ones go after an hour)."""
        self._leave_stacks()
        terminate_group(self.child.pid)

    def _leave_stacks(self) -> None:
        """Take the rank's stacks and NCCL dump and leave them on this host for the
        client, once: a SIGTERM, the parent's death and the channel's end may each come
        first, and a later one waits here until the stacks are left (it then stops the
        rank and ends this process, which would lose a half-taken dump)."""
        with self._leave_lock:
            if self._left or self.child is None or self._rank_ended.is_set():
                return
            self._left = True
            try:
                text, nccl = self.stacks.take(self.child.pid, nccl=True)
                left_stacks.leave(self.leave_prefix, self.rank, self.host, text, nccl)
            except OSError:
                pass  # nothing to say it to: the client says which ranks left no stacks

    def _read(self, pipe, stream: str) -> None:
        for raw in iter(pipe.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            self.tail.append(line)
            if self.stream_output and not (stream == "stderr" and self.quiet(line)):
                self.lines.put((stream, line))

    def _listen(self) -> None:
        """An abort from the driver, or the driver's loss, ends the rank (`KillRank` too)."""
        aborted = None
        try:
            while True:
                order = messages.decode(self.channel.recv(), messages.ORDERS)
                if isinstance(order, messages.Bye):
                    self.bye.set()
                    return
                if isinstance(order, messages.Abort):
                    aborted = order
                    break
                if isinstance(order, messages.Finish) and self.child is not None:
                    self.finished.set()
                    stop_group(self.child, grace_s=TERM_GRACE_S)
                if isinstance(order, messages.KillRank) and self.child is not None:
                    signal_group(self.child.pid, signal.SIGKILL)  # stopped or stuck: now
                if isinstance(order, messages.DumpStacks) and self.child is not None:
                    threading.Thread(target=self._dump, args=(order,), daemon=True).start()
                if isinstance(order, messages.Rejected):
                    sys.stderr.write(f"sparkdist supervisor: the driver rejected: {order}\n")
        except (EOFError, OSError, messages.MalformedMessage):
            if self.leave_prefix and not self._rank_ended.is_set():
                self._cut_off_soon()  # ends this process
                return
        if aborted and aborted.leave_stacks and self.leave_prefix:
            self._leave_stacks()  # a task was lost: its stage may end with no answer
        with self._leave_lock:  # a relayed job's stacks being left are left first
            if aborted and self.leave_prefix and not aborted.leave_stacks:  # the driver
                self._left = True  # stops the job itself: no client collects the stacks
                left_stacks.remove(self.leave_prefix, self.rank)
            if self.child is not None:
                stop_group(self.child, grace_s=1.0)
        self.stacks.close()
        os._exit(1)

    def _on_parent_death(self, _signum, _frame) -> None:
        """A signal handler may interrupt itself (a second SIGHUP): it takes no lock."""
        threading.Thread(target=self._cut_off_soon, name="sparkdist-parent-death").start()

    def _cut_off_soon(self) -> None:
        """A relayed job's supervisor lost its task: start `_cut_off` (once)."""
        with self._cut_lock:
            if self._cut_thread is None:
                self._cut_thread = threading.Thread(target=self._cut_off, name="sparkdist-cut")
                self._cut_thread.start()

    def _cut_off(self) -> None:
        """Take the rank's stacks and NCCL dump, leave them on this host for the client
        (which reaches no rank), then stop the rank and end, within CUT_OFF_LIMIT_S."""
        limit = threading.Timer(left_stacks.CUT_OFF_LIMIT_S, self._end_now)
        limit.daemon = True
        limit.start()
        try:
            self._leave_stacks()
        finally:
            if self.child is not None:
                stop_group(self.child, grace_s=1.0)
            self._end_now()

    def _end_now(self) -> None:
        if self.child is not None:
            signal_group(self.child.pid, signal.SIGKILL)
        self.stacks.close()
        os._exit(1)

    def _dump(self, order: messages.DumpStacks) -> None:
        """The rank's stacks, to the driver (off the listening thread: it waits)."""
        text, nccl = self.stacks.take(self.child.pid, order.nccl)
        try:
            self._send(messages.RankStacks(order.request, text, nccl))
        except OSError:
            pass  # the driver is gone


def terminate_group(pgid: int) -> None:
    """SIGTERM to the rank's group, SIGKILL `TERM_GRACE_S` later if it is still there."""
    signal_group(pgid, signal.SIGTERM)
    timer = threading.Timer(TERM_GRACE_S, signal_group, (pgid, signal.SIGKILL))
    timer.daemon = True
    timer.start()


def send_in_batches(lines: queue.Queue, send: Callable[[list], None]) -> None:
    """Send the queued output lines in batches of up to `BATCH_LINES`, in the order they
    were read, until None comes."""
    while True:
        item = lines.get()
        if item is None:
            return
        batch = [item]
        while len(batch) < BATCH_LINES:
            try:
                item = lines.get_nowait()
            except queue.Empty:
                break
            if item is None:
                send(batch)
                return
            batch.append(item)
        send(batch)


def main() -> None:
    # A relayed job's supervisor outlives its task long enough to leave its rank's stacks.
    relayed = job_environment.LEFT_STACKS in os.environ
    die_with_parent(signum=PARENT_DEATH_SIGNAL if relayed else signal.SIGKILL)
    if os.getppid() == 1:
        sys.exit(70)
    sys.exit(Supervisor(os.environ).run())


if __name__ == "__main__":
    main()
