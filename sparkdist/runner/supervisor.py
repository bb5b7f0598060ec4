"""A rank's supervisor: the process mpirun (or a task) starts for each rank.

It starts the rank's Python process, streams the rank's stdout and stderr to the
driver line by line, and reports how the rank ended, even when it was killed by a
signal and could report nothing itself. A SIGTERM it receives goes on to the rank.
It stays small (no framework imports) so that it starts in milliseconds.

Run as `python -m sparkdist.runner.supervisor`; everything it needs comes in the
environment (`SPARKDIST_*`, and Open MPI's `OMPI_COMM_WORLD_*` under mpirun).
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
from collections.abc import Mapping

from sparkdist import native_logs
from sparkdist.runner import wire
from sparkdist.runner.processes import (
    ProcessRecord,
    die_with_parent,
    popen_group,
    signal_group,
    stop_group,
)

TAIL_LINES = 40
BATCH_LINES = 500
TERM_GRACE_S = 10.0


def rank_layout(env: Mapping[str, str]) -> dict[str, str]:
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK for this rank.

    Under mpirun they come from Open MPI; under the direct launcher from sparkdist.
    """
    if "OMPI_COMM_WORLD_RANK" in env:
        return {
            "RANK": env["OMPI_COMM_WORLD_RANK"],
            "WORLD_SIZE": env["OMPI_COMM_WORLD_SIZE"],
            "LOCAL_RANK": env["OMPI_COMM_WORLD_LOCAL_RANK"],
            "LOCAL_WORLD_SIZE": env["OMPI_COMM_WORLD_LOCAL_SIZE"],
            "NODE_RANK": env.get("SPARKDIST_NODE_RANK", env.get("OMPI_COMM_WORLD_NODE_RANK", "0")),
        }
    return {
        "RANK": env["SPARKDIST_RANK"],
        "WORLD_SIZE": env["SPARKDIST_WORLD_SIZE"],
        "LOCAL_RANK": env["SPARKDIST_LOCAL_RANK"],
        "LOCAL_WORLD_SIZE": env["SPARKDIST_LOCAL_WORLD_SIZE"],
        "NODE_RANK": env.get("SPARKDIST_NODE_RANK", "0"),
    }


def rank_in_own_session(env: Mapping[str, str]) -> bool:
    """Whether the rank gets a session of its own: as its framework's launcher does.

    Linux's autogroup scheduler shares the CPU between sessions first. torchrun and
    `horovodrun --gloo` start every worker in a session of its own; mpirun's ranks
    stay in one session with orted. Measured here (2 ranks, 4 MB allreduces): Horovod's
    MPI controller, whose threads busy-poll, fell from 3.5 to 0.2-1 GB/s in a third of
    the jobs when its ranks had sessions of their own, and torch's Gloo allreduce lost
    7% when its ranks shared one.
    """
    return env.get("SPARKDIST_LAUNCHER", "direct") == "direct"


class Supervisor:
    def __init__(self, env: Mapping[str, str]):
        self.env = dict(env)
        self.secret = bytes.fromhex(self.env.pop("SPARKDIST_SECRET"))
        self.layout = rank_layout(self.env)
        self.rank = int(self.layout["RANK"])
        self.host = self.env.get("SPARKDIST_TASK_HOST", socket.gethostname())
        self.stream_output = self.env.get("SPARKDIST_LOG_MODE", "all") == "all"
        self.quiet = native_logs.below_level(self.env)  # C++ start-up logs, off by default
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.lines: queue.Queue = queue.Queue()
        self.bye = threading.Event()
        self.child = None
        host, port = self.env["SPARKDIST_DRIVER"].rsplit(":", 1)
        self.channel = wire.connect((host, int(port)), self.secret)

    def run(self) -> int:
        self.channel.send(("supervisor", self.rank, {"host": self.host, "pid": os.getpid()}))
        self.channel.send(("process", ProcessRecord.of(os.getpid(), "supervisor", self.host)))
        threading.Thread(target=self._listen, daemon=True).start()

        child_env = dict(self.env)
        child_env.update(self.layout)
        child_env["SPARKDIST_SECRET"] = self.secret.hex()
        child_env["SPARKDIST_SUPERVISOR_PID"] = str(os.getpid())
        child_env["PYTHONUNBUFFERED"] = "1"
        self.child = popen_group(
            [sys.executable, "-m", "sparkdist.runner.rank"],
            child_env,
            tie_to_parent=False,  # the rank sets its own parent-death signal
            new_session=rank_in_own_session(self.env),
            stdin=open(os.devnull, "rb"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        signal.signal(signal.SIGTERM, self._pass_on_sigterm)
        self.channel.send(("process", ProcessRecord.of(self.child.pid, "rank", self.host)))
        readers = [
            threading.Thread(target=self._read, args=(self.child.stdout, "stdout"), daemon=True),
            threading.Thread(target=self._read, args=(self.child.stderr, "stderr"), daemon=True),
        ]
        for reader in readers:
            reader.start()
        sender = threading.Thread(target=self._send_output, daemon=True)
        sender.start()

        exit_code = self.child.wait()
        # Whatever the rank left behind in its process group goes with it.
        stop_group(self.child, grace_s=1.0)
        for reader in readers:
            reader.join(timeout=5)
        self.lines.put(None)
        sender.join(timeout=5)
        self.channel.send(("exit", exit_code, list(self.tail)))
        self.bye.wait(timeout=10)
        self.channel.close()
        return exit_code if exit_code >= 0 else 128 - exit_code

    def _pass_on_sigterm(self, signum, frame) -> None:
        """SIGTERM (an operator, a host being decommissioned, orted ending the job) goes
        to the rank, which may stop cleanly, e.g. save a checkpoint; its end is then
        reported like any other, so the driver knows the rank died of a signal, not of
        its code. A rank still running TERM_GRACE_S later is killed."""
        signal_group(self.child.pid, signal.SIGTERM)
        timer = threading.Timer(TERM_GRACE_S, signal_group, (self.child.pid, signal.SIGKILL))
        timer.daemon = True
        timer.start()

    def _read(self, pipe, stream: str) -> None:
        for raw in iter(pipe.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            self.tail.append(line)
            if self.stream_output and not (stream == "stderr" and self.quiet(line)):
                self.lines.put((stream, line))

    def _send_output(self) -> None:
        """Send output lines in batches, in the order they were read."""
        while True:
            item = self.lines.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < BATCH_LINES:
                try:
                    item = self.lines.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self.channel.send(("output", batch))
                    return
                batch.append(item)
            self.channel.send(("output", batch))

    def _listen(self) -> None:
        """An abort from the driver, or the driver's loss, ends the rank."""
        try:
            while True:
                message = self.channel.recv()
                if message[0] == "bye":
                    self.bye.set()
                    return
                if message[0] == "abort":
                    break
        except (EOFError, OSError):
            pass
        if self.child is not None:
            stop_group(self.child, grace_s=1.0)
        os._exit(1)


def main() -> None:
    die_with_parent()
    if os.getppid() == 1:
        sys.exit(70)
    sys.exit(Supervisor(os.environ).run())


if __name__ == "__main__":
    main()
