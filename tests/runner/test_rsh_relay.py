"""mpirun's rsh agent and task 0's launch relay, over a real Unix socket and a real task
agent: only a caller with the job's relay token is served, and the agent still verifies
every command; the agent itself imports nothing heavy."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys

import pytest

from sparkdist import job_environment
from sparkdist.protocol import wire
from sparkdist.runner.task import rsh
from sparkdist.runner.task.agent import TaskAgent
from sparkdist.runner.task.rsh_relay import LaunchRelay


@pytest.fixture
def relay():
    records = []
    secret = wire.new_secret()
    agent = TaskAgent(secret, "127.0.0.1", dict(os.environ), records.append)
    relay = LaunchRelay({"task-0": ("127.0.0.1", agent.port)}, secret)
    yield relay, records
    relay.close()
    agent.close()


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
    relay_ = LaunchRelay({}, wire.new_secret())
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
