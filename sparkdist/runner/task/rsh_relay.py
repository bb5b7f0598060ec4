"""Task 0's launch relay: the authenticated half of mpirun's rsh agent.

mpirun starts one rsh agent (`rsh.py`) per task. Each of those used to start Python
with sparkdist, ssl and the protocol (about 100 ms of CPU per task); now the agent is
a stdlib-only client that hands its call here, to a thread of the task 0 process that
started mpirun, which already holds the agents' addresses and the job secret. Per call:
the authenticated `wire.connect` to that task's agent (TLS + HMAC), `OrtedLaunch`, then
the agent's `OrtedOutput`s and its `OrtedExit` back to the client. The agent verifies
the command line as before.

A channel to an agent that ends before the agent said how its daemon ended (and not
because mpirun went) means that task's executor, host or network is lost: the relay
says so (`lost`; task 0 tells the driver) before its client exits, since mpirun then
ends the job and SIGTERMs every other rank, whose ends would otherwise reach the driver
before its own channels to the lost host time out. When mpirun goes, the relay tells
the agent (`Abort`), which then stops its daemon without reporting a loss.

Who may call: the socket lives in a directory only this user can enter (`mkdtemp`,
mode 0700), and a caller must first send the job's random relay token, which only
mpirun's environment holds (docs/security.md).
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import shutil
import socket
import threading
from collections.abc import Callable, Mapping

from sparkdist.errors import exit_status
from sparkdist.job_environment import RSH_RELAY, RSH_TOKEN
from sparkdist.protocol import messages, owned_dirs, wire
from sparkdist.runner.task import rsh

logger = logging.getLogger(__name__)


class LaunchRelay:
    """Serves mpirun's rsh agents on a private Unix socket until `close`."""

    def __init__(
        self,
        agents: Mapping[str, tuple[str, int]],
        secret: wire.JobSecret,
        lost: Callable[[str, str, str], None],
    ):
        """`lost(task, host, why)` is called when the channel to `task`'s agent (on `host`)
        broke while its daemon ran (see above)."""
        self._agents = dict(agents)
        self._secret = secret
        self._lost = lost
        self._token = secrets.token_hex(32).encode()
        self._dir = owned_dirs.make("sparkdist-rsh-")
        self.path = os.path.join(self._dir, "relay")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(128)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="sparkdist-rsh-relay", daemon=True).start()

    def env(self) -> dict[str, str]:
        """What mpirun's environment needs for its rsh agents to reach this relay."""
        return {RSH_RELAY: self.path, RSH_TOKEN: self._token.decode()}

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                self._open.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            kind, body = rsh.read_frame(conn)
            token, argv = rsh.decode_request(body)
            if kind != rsh.REQUEST or not hmac.compare_digest(os.fsencode(token), self._token):
                logger.warning("rsh relay refused a caller without the job's token")
                conn.sendall(rsh.frame(rsh.ERROR, b"refused: not this job's rsh agent"))
                return
            if len(argv) < 2:
                conn.sendall(rsh.frame(rsh.ERROR, b"expected TASK-NAME COMMAND..."))
                return
            task, command = argv[0], " ".join(argv[1:])
            if task not in self._agents:
                known = sorted(self._agents)
                conn.sendall(rsh.frame(rsh.ERROR, f"unknown task {task!r} ({known})".encode()))
                return
            self._launch(conn, task, command)
        except (EOFError, OSError) as exc:
            logger.debug("rsh relay: a call ended early: %s", exc)
        finally:
            with self._lock:
                self._open.discard(conn)
            _shut(conn)
            conn.close()

    def _launch(self, conn: socket.socket, task: str, command: str) -> None:
        """Ask `task`'s agent to start `command`; relay what it says until the daemon ends.
        If the client goes (mpirun died), the agent's channel closes, and the agent stops
        the daemon."""
        channel = wire.connect(self._agents[task], self._secret)
        client_gone = threading.Event()
        watcher = threading.Thread(
            target=_close_on_eof, args=(conn, channel, client_gone), daemon=True
        )
        watcher.start()
        try:
            channel.send(messages.encode(messages.OrtedLaunch(command)))
            while True:
                reply = self._reply(channel, task, client_gone)
                if isinstance(reply, messages.OrtedOutput):
                    conn.sendall(rsh.frame(rsh.OUTPUT, reply.text.encode()))
                elif isinstance(reply, messages.OrtedExit):
                    status = exit_status(reply.exit_code)
                    conn.sendall(rsh.frame(rsh.EXIT, str(status).encode()))
                    return
                else:
                    text = f"task {task} refused to start orted: {reply.reason}"
                    conn.sendall(rsh.frame(rsh.ERROR, text.encode()))
                    return
        except (wire.AuthenticationError, messages.MalformedMessage) as exc:
            conn.sendall(rsh.frame(rsh.ERROR, f"task {task}'s agent: {exc}".encode()))
        finally:
            channel.close()

    def _reply(self, channel: wire.Channel, task: str, client_gone: threading.Event):
        """The agent's next reply. An agent always says how its daemon ended: a channel
        that ends first (a reset reads as an end under TLS) lost the agent, unless the
        client went. (A write to a client that went is no loss.)"""
        try:
            return messages.decode(channel.recv(), messages.AGENT_REPLIES)
        except wire.AuthenticationError:
            raise
        except (EOFError, OSError) as exc:
            if not client_gone.is_set():
                self._lost(task, self._agents[task][0], f"{type(exc).__name__}: {exc}")
            raise

    def close(self) -> None:
        """Stop accepting, end every open call (its client exits 255), remove the socket."""
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            open_calls = list(self._open)
        for conn in open_calls:
            _shut(conn)  # its call's thread closes it
        shutil.rmtree(self._dir, ignore_errors=True)


def _shut(conn: socket.socket) -> None:
    """End a call's connection for both its ends: this wakes its watcher's `recv` (a
    close alone does not, and the client would wait for a last frame forever)."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _close_on_eof(conn: socket.socket, channel: wire.Channel, gone: threading.Event) -> None:
    """The client sends nothing after its request: EOF means it is gone."""
    try:
        while conn.recv(4096):
            pass
    except OSError:
        pass
    gone.set()
    try:  # the agent stops its daemon: on purpose, not because task 0 was lost
        channel.send(messages.encode(messages.Abort("mpirun went")))
    except OSError:
        pass
    channel.close()
