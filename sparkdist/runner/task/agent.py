"""The task agent: how mpirun starts its daemons inside Spark tasks, without SSH.

mpirun's rsh agent is `python -m sparkdist.runner.task.rsh TASK-NAME COMMAND`; that
command connects to the named task's agent over an authenticated channel and asks
it to run COMMAND. The agent runs it only if it is an Open MPI daemon (`orted`)
command line: the executable is this host's own `orted`, and every argument is an
Open MPI option. The daemon runs as a child of the Spark task, so the ranks it
starts are children of the task too, and die with it.

The daemon is stopped when its caller goes. The relay says `Abort` when mpirun went; a
channel that ends without a word lost task 0 (its executor, host or network), and the
agent says so (`on_lost`) before it stops the daemon, whose ranks' ends would otherwise
reach the driver first.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping

from sparkdist.protocol import messages, wire
from sparkdist.protocol.processes import ProcessRecord, popen_group, stop_group

logger = logging.getLogger(__name__)

_MCA_KEY = re.compile(r"^[A-Za-z0-9_]+$")
_FLAGS = {"--tree-spawn", "--debug-daemons", "-d", "--leave-session-attached"}


class RejectedCommand(ValueError):
    """A command the agent will not run."""


def parse_orted_command(command: str) -> list[str]:
    """Check that `command` is an `orted` command line; return its arguments.

    Accepted: `orted` (by name or by path ending in /orted), then only
    `-mca|--mca KEY VALUE` triples and a few known flags. Anything else, including
    shell syntax (`;`, `&&`, environment assignments), is rejected.
    """
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise RejectedCommand(f"unparseable command: {exc}") from exc
    if not argv or os.path.basename(argv[0]) != "orted":
        raise RejectedCommand(f"not an orted command: {command[:80]!r}")
    args = argv[1:]
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-mca", "--mca"):
            if i + 2 >= len(args):
                raise RejectedCommand(f"incomplete {arg} option")
            if not _MCA_KEY.match(args[i + 1]):
                raise RejectedCommand(f"bad MCA parameter name {args[i + 1]!r}")
            i += 3
        elif arg in _FLAGS:
            i += 1
        else:
            raise RejectedCommand(f"unexpected orted argument {arg!r}")
    return args


def own_session_dir(args: list[str], tmpdir: str | None) -> list[str]:
    """`args` with `orte_tmpdir_base` set to this task's own directory.

    mpirun passes every daemon its own `-mca orte_tmpdir_base` (a directory of task 0's),
    so all of a job's daemons would share one session tree. Each starting daemon clears
    that tree (Open MPI removes "stale" directories of the job before making its own),
    and task 0 removes it when it ends, while another daemon may be creating its files
    there: "orte_session_dir failed ... ORTE was unable to reliably start". Each daemon
    keeps its session under its own task's directory instead. A directory the user
    chose (`mpi_args`) is left as it is: only another task's of this job
    (`sparkdist-JOB-taskN-...`, beside this task's) is replaced.
    """
    if tmpdir is None:
        return args
    job_prefix = os.path.basename(tmpdir).rsplit("-task", 1)[0] + "-task"
    args = list(args)
    for i, arg in enumerate(args[:-2]):
        value = args[i + 2]
        if (
            arg in ("-mca", "--mca")
            and args[i + 1] == "orte_tmpdir_base"
            and os.path.dirname(value) == os.path.dirname(tmpdir)
            and os.path.basename(value).startswith(job_prefix)
        ):
            args[i + 2] = tmpdir
    return args


class TaskAgent:
    """Serves verified `orted` launches for one Spark task of one job."""

    def __init__(
        self,
        secret: wire.JobSecret,
        host: str,
        env: Mapping[str, str],
        on_process: Callable[[ProcessRecord], None],
        on_lost: Callable[[str, str], None] | None = None,
    ):
        """`on_lost(host, why)`: the channel from task 0's relay (on `host`) ended without
        a word while a daemon ran."""
        self._env = dict(env)
        self._host = host
        self._on_process = on_process
        self._on_lost = on_lost
        self._orted = shutil.which("orted", path=self._env.get("PATH"))
        self._children: dict[int, subprocess.Popen] = {}
        self._lock = threading.Lock()
        self._server = wire.Server(secret, self._handle, host=host, name="sparkdist-agent")
        self.port = self._server.address[1]

    def _reply(self, channel: wire.Channel, message) -> None:
        channel.send(messages.encode(message))

    def _handle(self, channel: wire.Channel) -> None:
        try:
            request = messages.decode(channel.recv(), (messages.OrtedLaunch,))
        except messages.MalformedMessage as exc:
            logger.warning("task agent refused a request: %s", exc)
            self._reply(channel, messages.Rejected(str(exc)))
            return
        try:
            args = parse_orted_command(request.command)
            if self._orted is None:
                raise RejectedCommand(f"orted is not installed on host {self._host}")
        except RejectedCommand as exc:
            logger.warning("task agent refused a command: %s", exc)
            self._reply(channel, messages.Rejected(str(exc)))
            return
        args = own_session_dir(args, self._env.get("OMPI_MCA_orte_tmpdir_base"))
        # Spawned from this handler thread, which waits for the daemon: the daemon's
        # parent-death signal is tied to this thread staying alive until it ends.
        proc = popen_group(
            [self._orted, *args],
            self._env,
            stdin=open(os.devnull, "rb"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        with self._lock:
            self._children[proc.pid] = proc
        self._on_process(ProcessRecord.of(proc.pid, "orted", self._host))
        watcher = threading.Thread(target=self._watch_client, args=(channel, proc), daemon=True)
        watcher.start()
        try:
            for raw in iter(proc.stdout.readline, b""):
                self._reply(channel, messages.OrtedOutput(raw.decode("utf-8", errors="replace")))
            self._reply(channel, messages.OrtedExit(proc.wait()))
        except OSError:
            stop_group(proc)
        finally:
            with self._lock:
                self._children.pop(proc.pid, None)

    def _watch_client(self, channel: wire.Channel, proc) -> None:
        """When the rsh client goes away (mpirun went, or task 0 was lost), the daemon
        goes too."""
        try:
            channel.recv()  # the relay's Abort: mpirun went
        except wire.AuthenticationError:
            pass  # a forged frame: stop the daemon, but nothing was lost
        except (EOFError, OSError) as exc:  # under TLS a reset reads as an end
            if proc.poll() is None and self._on_lost is not None:
                host = channel.peer.rsplit(":", 1)[0]
                self._on_lost(host, f"{type(exc).__name__}: {exc}")
        if proc.poll() is None:
            stop_group(proc)

    def kill_children(self) -> None:
        with self._lock:
            children = list(self._children.values())
        for proc in children:
            stop_group(proc)

    def close(self) -> None:
        self._server.close()
        self.kill_children()
