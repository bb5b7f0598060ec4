"""Every control channel is authenticated with the job secret; the task agent runs
nothing but a verified orted command."""

from __future__ import annotations

import os
import socket
import struct

import pytest

from sparkdist.protocol import wire
from sparkdist.runner.driver.job_spec import JobSpec
from sparkdist.runner.driver.job_state import JobState
from sparkdist.runner.driver.service import DriverService
from sparkdist.runner.task.agent import RejectedCommand, TaskAgent, parse_orted_command


@pytest.fixture
def agent(tmp_path):
    records = []
    secret = wire.new_secret()
    agent = TaskAgent(secret, "127.0.0.1", dict(os.environ), records.append)
    yield secret, agent, records
    agent.close()


def test_wrong_secret_executes_nothing(agent, tmp_path):
    _, agent_, records = agent
    target = tmp_path / "pwned"
    with pytest.raises(wire.AuthenticationError):
        channel = wire.connect(("127.0.0.1", agent_.port), wire.new_secret())
        channel.send(("orted", f"orted -mca x y; touch {target}"))
        channel.recv()
    assert not target.exists()
    assert records == []


def test_raw_bytes_without_handshake_are_dropped(agent, tmp_path):
    """A plain-TCP peer gets no TLS session, so nothing it sends is read."""
    _, agent_, records = agent
    target = tmp_path / "pwned"
    with socket.create_connection(("127.0.0.1", agent_.port)) as sock:
        sock.settimeout(10)
        sock.sendall(b"\0" * 64 + f"touch {target}".encode())
        try:
            reply = sock.recv(100)
        except ConnectionResetError:
            reply = b""
        assert reply == b""  # the agent hung up
    assert not target.exists() and records == []


def test_right_secret_but_not_orted_is_refused(agent, tmp_path):
    secret, agent_, records = agent
    target = tmp_path / "pwned"
    for command in (
        f"touch {target}",
        f"orted -mca a b ; touch {target}",
        f"orted && touch {target}",
    ):
        channel = wire.connect(("127.0.0.1", agent_.port), secret)
        channel.send(("orted", command))
        kind, reason = channel.recv()
        channel.close()
        assert kind == "rejected", command
        assert reason
    assert not target.exists() and records == []


def test_tampered_frame_is_rejected():
    secret = wire.new_secret()
    received = []
    server = wire.Server(secret, lambda ch: received.append(ch.recv()))
    try:
        channel = wire.connect(server.address, secret)
        body = b"\x80\x04K\x01."  # pickle of 1, sent with a made-up MAC
        channel.sock.sendall(struct.pack("!Q", len(body)) + b"\0" * 32 + body)
        channel.sock.settimeout(10)
        try:
            reply = channel.sock.recv(10)
        except ConnectionResetError:
            reply = b""
        assert reply == b""
        assert received == []
        good = wire.connect(server.address, secret)
        good.send(("hello", 1))
        good.close()
    finally:
        server.close()


def test_driver_service_rejects_wrong_secret():
    state = JobState(JobSpec("job", 1, b"payload", False, "all"))
    service = DriverService(state, wire.new_secret(), "127.0.0.1", "127.0.0.1")
    try:
        with pytest.raises(wire.AuthenticationError):
            channel = wire.connect(service.address, wire.new_secret())
            channel.send(("rank", 0, {"host": "x"}))
            channel.recv()
        assert not state.ranks[0].started
    finally:
        service.close()


@pytest.mark.parametrize(
    "command",
    [
        'orted -mca ess "env" -mca ess_base_vpid 1 -mca orte_hnp_uri "1.0;tcp://127.0.0.1:5"',
        "/usr/bin/orted --mca plm rsh --tree-spawn -mca pmix ^s1,s2",
    ],
)
def test_orted_commands_accepted(command):
    assert parse_orted_command(command)[0] in ("-mca", "--mca")


@pytest.mark.parametrize(
    "command",
    [
        "bash -c id",
        "orted -mca ess",
        "orted -mca bad-key value",
        "PATH=/tmp:$PATH ; export PATH ; orted -mca a b",
        "orted -mca a b extra",
        "orted 'unterminated",
    ],
)
def test_other_commands_rejected(command):
    with pytest.raises(RejectedCommand):
        parse_orted_command(command)


def test_each_orted_keeps_its_session_under_its_own_task():
    """mpirun hands every daemon task 0's orte_tmpdir_base; the agent puts its own."""
    from sparkdist.runner.task.agent import own_session_dir

    task0, task1 = "/tmp/sparkdist-ab12-task0-x1", "/tmp/sparkdist-ab12-task1-y2"
    args = ["-mca", "ess", "env", "-mca", "orte_tmpdir_base", task0, "--tree-spawn"]
    assert own_session_dir(args, task1) == [
        "-mca",
        "ess",
        "env",
        "-mca",
        "orte_tmpdir_base",
        task1,
        "--tree-spawn",
    ]
    assert own_session_dir(args, None) == args
    # The user's own choice (mpi_args) and another job's directory stay as they are.
    for other in ("/scratch/ompi", "/tmp/sparkdist-cd34-task0-z3"):
        args = ["-mca", "orte_tmpdir_base", other]
        assert own_session_dir(args, task1) == args


def test_job_secret_shows_no_key_material():
    """Reprs, the environment form and the clients' copy hold no more than they must."""
    from sparkdist.protocol import messages
    from sparkdist.protocol.job_secret import JobSecret

    secret = wire.new_secret()
    assert secret.tls and secret.can_serve
    for text in (repr(secret), str(secret), secret.to_text()):
        assert "PRIVATE" not in text and "CERTIFICATE" not in text
    assert secret.hmac_key.hex() not in repr(secret)
    client = JobSecret.from_text(secret.to_text())
    assert (client.hmac_key, client.pin) == (secret.hmac_key, secret.pin)
    assert client.private_key is None and not client.can_serve
    assert secret.for_clients() == client
    with pytest.raises(ValueError, match="no private key"):
        wire.Server(client, lambda channel: None)
    plain = wire.new_secret(tls=False)
    assert not plain.tls and JobSecret.from_text(plain.to_text()) == plain
    # Rank 0's credentials ride in its welcome; no repr of it shows their values.
    welcome = messages.Welcome(b"", True, "job", messages.SecretEnv(DATABRICKS_TOKEN="dapi-x"))
    assert "dapi-x" not in repr(welcome) and "DATABRICKS_TOKEN" in repr(welcome)
