"""mpirun's rsh agent and task 0's launch relay, over a real Unix socket and a real task
agent: only a caller with the job's relay token is served, and the agent still verifies
every command; the agent itself imports nothing heavy. A channel to an agent that breaks
while its daemon runs is reported as that task lost, before the client exits; an agent
that ends its channel, or a client that goes, is no loss."""

from __future__ import annotations

import os
import socket
import stat
import struct
import subprocess
import sys
import threading
import time

import psutil
import pytest

from sparkdist import job_environment
from sparkdist.protocol import messages, wire
from sparkdist.runner.task import rsh
from sparkdist.runner.task.agent import TaskAgent
from sparkdist.runner.task.rsh_relay import LaunchRelay


@pytest.fixture
def relay():
    records = []
    secret = wire.new_secret()
    agent = TaskAgent(secret, "127.0.0.1", dict(os.environ), records.append)
    relay = LaunchRelay({"task-0": ("127.0.0.1", agent.port)}, secret, no_loss)
    yield relay, records
    relay.close()
    agent.close()


def no_loss(task: str, host: str, why: str) -> None:
    raise AssertionError(f"no agent was lost, yet the relay said {task} on {host}: {why}")


def start_call(relay_: LaunchRelay, **popen) -> subprocess.Popen:
    """The rsh agent as mpirun starts it for task-1's daemon, left running."""
    argv = [sys.executable, "-S", "-I", rsh.__file__, "task-1", "orted"]
    return subprocess.Popen(argv, env=relay_.env(), **popen)


def run_client(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    """The rsh agent as mpirun starts it."""
    return subprocess.run(
        [sys.executable, "-S", "-I", rsh.__file__, *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_client_without_the_token_is_refused(relay, tmp_path):
    relay_, records = relay
    target = tmp_path / "pwned"
    env = {**relay_.env(), rsh.TOKEN: "0" * 64}
    done = run_client(env, "task-0", f"orted; touch {target}")
    assert done.returncode == 255
    assert "refused" in done.stderr
    # A raw caller without the token (none, or not even text) starts nothing either.
    for body in (b"task-0\0orted", "\u00e9t\u00e9\0task-0\0orted".encode(), b""):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(relay_.path)
            sock.sendall(rsh.frame(rsh.REQUEST, body))
            kind, reply = rsh.read_frame(sock)
        assert kind == rsh.ERROR and b"refused" in reply
    assert not target.exists() and records == []


def test_the_socket_is_private_to_its_user(relay):
    relay_, _ = relay
    mode = stat.S_IMODE(os.stat(os.path.dirname(relay_.path)).st_mode)
    assert mode == 0o700


def test_the_agent_still_verifies_what_the_relay_passes(relay, tmp_path):
    relay_, records = relay
    target = tmp_path / "pwned"
    done = run_client(relay_.env(), "task-0", f"orted -mca x y; touch {target}")
    assert done.returncode == 255
    assert "refused to start orted" in done.stderr
    done = run_client(relay_.env(), "task-9", "orted")
    assert done.returncode == 255 and "unknown task 'task-9'" in done.stderr
    assert not target.exists() and records == []


def test_a_closed_relay_ends_its_clients():
    relay_ = LaunchRelay({}, wire.new_secret(), no_loss)
    env = relay_.env()
    relay_.close()
    done = run_client(env, "task-0", "orted")
    assert done.returncode == 255 and "launch relay" in done.stderr
    assert not os.path.exists(os.path.dirname(env[rsh.RELAY]))


def test_the_rsh_agent_reads_the_variables_job_environment_declares():
    assert (rsh.RELAY, rsh.TOKEN) == (job_environment.RSH_RELAY, job_environment.RSH_TOKEN)


def test_the_rsh_agent_imports_neither_sparkdist_nor_ssl_nor_socket_py():
    """It runs once per task: only the C half of socket (`socket.py` imports enum and
    selectors, as much CPU as the rest of the agent)."""
    done = subprocess.run(
        [sys.executable, "-S", "-I", "-X", "importtime", rsh.__file__, "task-0", "orted"],
        env={},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 255
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert "_socket" in imported
    assert not {"socket", "enum", "selectors"} & imported
    assert not {name for name in imported if name.startswith(("ssl", "sparkdist", "_ssl"))}


class DaemonAgent:
    """A task agent whose daemon is started, then its channel ends as `end` says:
    "reset" (the connection breaks, as a lost host's does once its keepalive runs out),
    "close" (the agent's process died), "exit" (the daemon exited: `OrtedExit`) or "wait"
    (until the client goes)."""

    def __init__(self, secret: wire.JobSecret, end: str):
        self.end = end
        self.launched = threading.Event()
        self.release = threading.Event()
        self.ended = threading.Event()
        """Set once the relay closed the channel ("wait")."""
        self.server = wire.Server(secret, self._handle)

    def _handle(self, channel: wire.Channel) -> None:
        messages.decode(channel.recv(), (messages.OrtedLaunch,))
        channel.send(messages.encode(messages.OrtedOutput("daemon up\n")))
        self.launched.set()
        if self.end == "wait":
            try:
                channel.recv()  # the relay closes the channel when its client goes
            except (EOFError, OSError):
                pass
            self.ended.set()
            return
        self.release.wait(30)
        if self.end == "exit":
            channel.send(messages.encode(messages.OrtedExit(0)))
            return
        if self.end == "reset":  # no FIN: the peer's next read fails
            channel.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        channel.sock.close()


@pytest.mark.parametrize("end", ["reset", "close", "exit"])
def test_an_agent_lost_mid_daemon_is_reported_before_the_client_exits(end):
    secret = wire.new_secret()
    agent = DaemonAgent(secret, end)
    said = []
    relay_ = LaunchRelay({"task-1": agent.server.address}, secret, lambda *a: said.append(a))
    try:
        client = start_call(relay_, stderr=subprocess.PIPE, text=True)
        assert agent.launched.wait(30)
        assert said == []  # the daemon runs: nothing lost
        agent.release.set()
        # The client ends at once (mpirun learns the daemon is gone), never waits.
        _, stderr = client.communicate(timeout=60)
        assert "daemon up" in stderr
        if end == "exit":
            assert client.returncode == 0 and said == []
        else:
            # Said before the client's exit, which makes mpirun end the job.
            assert client.returncode == 255
            assert [(task, host) for task, host, _ in said] == [("task-1", "127.0.0.1")]
    finally:
        relay_.close()
        agent.server.close()


def test_a_client_that_goes_loses_no_agent():
    secret = wire.new_secret()
    agent = DaemonAgent(secret, "wait")
    said = []
    relay_ = LaunchRelay({"task-1": agent.server.address}, secret, lambda *a: said.append(a))
    try:
        client = start_call(relay_, stderr=subprocess.DEVNULL)
        assert agent.launched.wait(30)
        client.kill()  # mpirun went: the relay closes the agent's channel
        client.wait(30)
        assert agent.ended.wait(30)
        deadline = time.monotonic() + 30
        while relay_._open and time.monotonic() < deadline:  # the relay's call ends too
            time.sleep(0.01)
        assert not relay_._open
        assert said == []  # no agent was lost
    finally:
        relay_.close()
        agent.server.close()


@pytest.mark.parametrize("relay_ends", ["without a word", "with Abort"])
def test_an_agent_that_loses_task_0_says_so_before_it_stops_its_daemon(tmp_path, relay_ends):
    """The relay's side lost (task 0's host cut off) or mpirun gone (the relay says Abort):
    the daemon stops either way; only a loss is reported, while the daemon still runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    orted = bin_dir / "orted"
    orted.write_text("#!/bin/sh\nexec sleep 300\n")
    orted.chmod(0o755)
    secret = wire.new_secret()
    records, lost = [], []

    def on_lost(host: str, why: str) -> None:
        lost.append((host, psutil.pid_exists(records[0].pid)))

    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"  # the stand-in's own `sleep` too
    agent = TaskAgent(secret, "127.0.0.1", {"PATH": path}, records.append, on_lost)
    try:
        channel = wire.connect(("127.0.0.1", agent.port), secret)
        channel.send(messages.encode(messages.OrtedLaunch("orted --tree-spawn")))
        deadline = time.monotonic() + 30
        while not records and time.monotonic() < deadline:
            time.sleep(0.01)
        daemon = psutil.Process(records[0].pid)
        if relay_ends == "with Abort":
            channel.send(messages.encode(messages.Abort("mpirun went")))
        channel.close()
        daemon.wait(30)  # stopped (psutil.TimeoutExpired otherwise)
        if relay_ends == "with Abort":
            assert lost == []
        else:
            assert lost == [("127.0.0.1", True)]  # said while the daemon still ran
    finally:
        agent.close()
