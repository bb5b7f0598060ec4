"""Decode processes: a rank's windows decoded beside its process (``reader_pool_type="process"``).

Why: decode threads share the rank's GIL with the thread that cuts batches and with the
training loop. A shuffled window's gathers are thousands of short ``np.take`` calls, each
letting go of the GIL and taking it back, so a second thread gave 1.08-1.25x one, where
two processes gave 2.0x (docs/data.md, "Decode processes"). Here a window's tasks (its
row groups' column groups) run in the processes, which write the rows straight into the
window's pieces, in shared memory (`sparkdist.data.rank.shared_slabs`): nothing comes
back but "done", and the rank hands the pieces out as it hands out its threads'.

Each process has its own pipe, and gets a window's share of the tasks in one message: the
reading thread sends and waits itself. (``ProcessPoolExecutor`` ran at the speed of two
threads: a task a message, fed and collected by two threads of the rank that wait for
its GIL, 5 ms at a time, while the reading thread cuts batches.) The processes are forked,
as DataLoader's workers are (one starts in milliseconds, not the half second a fresh
interpreter takes to import numpy and pyarrow); an error in one comes back with its
traceback, one that dies is an error in the rank, never a hang, and each leaves as soon
as the rank's process is gone.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any


def usable() -> str | None:
    """Why this process cannot start decode processes (None: it can)."""
    if not hasattr(os, "memfd_create") or not os.path.isdir(f"/proc/{os.getpid()}/fd"):
        return "decode processes need Linux (memfd and /proc)"
    if multiprocessing.current_process().daemon:  # a DataLoader worker: already a process
        return "a DataLoader worker process cannot start processes of its own"
    return None


class RemoteError(Exception):
    """A decode process's traceback, the cause of the error it raised."""


class Done:
    """A process's share of a window, sent: `result` waits for it (a future's face)."""

    def __init__(self, worker: _Worker) -> None:
        self.worker = worker
        self.finished = False
        self.error: BaseException | None = None

    def result(self) -> None:
        while not self.finished:
            self.worker.receive()
        if self.error is not None:
            raise self.error

    def cancel(self) -> bool:
        return False  # sent already: `DecodeProcesses.close` stops the processes


class _Worker:
    """One decode process, its pipe, and the shares sent to it that are not yet done."""

    def __init__(self, context: Any) -> None:
        self.connection, theirs = context.Pipe()
        self.process = context.Process(
            target=_serve, args=(theirs, os.getpid()), name="sparkdist-decode", daemon=True
        )
        self.process.start()
        theirs.close()
        self.waiting: collections.deque[Done] = collections.deque()

    def send(self, function: Callable, args: Sequence[tuple]) -> Done:
        done = Done(self)
        try:
            self.connection.send((function, args))
        except OSError as lost:  # a broken pipe: the process is gone
            self._died(lost)
        self.waiting.append(done)
        return done

    def receive(self) -> None:
        """The next share's outcome (they finish in the order they were sent)."""
        try:
            error = self.connection.recv()
        except (EOFError, OSError) as lost:
            self._died(lost)
        done = self.waiting.popleft()
        if error is not None:
            exception, text = error
            exception.__cause__ = RemoteError(text)
            done.error = exception
        done.finished = True

    def _died(self, lost: BaseException) -> None:
        self.process.join(1)
        raise RuntimeError(
            f"a sparkdist decode process died while decoding (exit code "
            f"{self.process.exitcode}: killed, or out of memory?); read with "
            "reader_pool_type='thread' to decode in the rank's own process"
        ) from lost


class DecodeProcesses:
    """``count`` forked decode processes, until `close`."""

    def __init__(self, count: int) -> None:
        context = multiprocessing.get_context("fork")
        self.workers: list[_Worker] = []
        try:
            for _ in range(count):
                self.workers.append(_Worker(context))
        except BaseException:
            self.close()
            raise

    @property
    def count(self) -> int:
        return len(self.workers)

    def run(self, function: Callable, tasks: Sequence[tuple]) -> list[Done]:
        """``function(*task)`` for each task, the tasks dealt in turn to the processes,
        each process's share sent in one message."""
        shares = [list(tasks[index :: self.count]) for index in range(self.count)]
        return [
            worker.send(function, share)
            for worker, share in zip(self.workers, shares, strict=True)
            if share
        ]

    def close(self) -> None:
        """Stop the processes at once: what they were decoding is not read any more."""
        for worker in self.workers:
            worker.process.kill()
        for worker in self.workers:
            worker.process.join()
            worker.connection.close()
        self.workers = []


def _serve(connection: Any, parent: int) -> None:
    """A decode process: run each share sent, answer None or (the error, its traceback).

    Ctrl-C reaches the whole process group: the rank stops its processes, which ignore it
    (no traceback of theirs on the terminal). It leaves with ``os._exit``: a normal exit
    would flush what the rank had buffered for stdout when it forked, a second time.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch, args=(parent,), name="parent-watch", daemon=True).start()
    while True:
        try:
            function, tasks = connection.recv()
        except EOFError:
            os._exit(0)
        try:
            for task in tasks:
                function(*task)
            connection.send(None)
        except Exception as error:
            text = traceback.format_exc()
            try:
                connection.send((error, text))
            except Exception:  # an error that does not pickle: its text
                connection.send((RuntimeError(str(error)), text))


def _watch(parent: int) -> None:
    """Leave as soon as the rank's process is gone (checked twice a second): one killed
    with SIGKILL cannot stop its decode processes."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)
