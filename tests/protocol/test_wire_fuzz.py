"""Bad input on the wire, fuzzed (Hypothesis): whatever a peer sends, a sparkdist server
answers with a refusal or a closed connection, never hangs, never crashes, and never
unpickles a frame whose authentication failed."""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import socket
import ssl
import struct
import threading
from typing import NamedTuple

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sparkdist.protocol import messages, wire
from sparkdist.protocol.job_secret import JobSecret, new_secret
from sparkdist.runner.driver.job_spec import JobSpec
from sparkdist.runner.driver.job_state import JobState
from sparkdist.runner.driver.service import DriverService

# Every read has a bound: a server that hangs fails the test instead of hanging it.
READ_TIMEOUT_S = 10
FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

FIRED: list[tuple[str, int]] = []
"""Tripwires that were unpickled, (token, index)."""


def _fire(token: str, index: int) -> None:
    FIRED.append((token, index))


class Tripwire:
    """Unpickling it records (token, index): the test sees every frame that was loaded."""

    def __init__(self, token: str, index: int):
        self.token, self.index = token, index

    def __reduce__(self):
        return _fire, (self.token, self.index)


class Recorder:
    """A bare `wire.Server` whose handler receives until its channel fails."""

    def __init__(self, secret: JobSecret):
        self.errors: list[BaseException] = []
        self.server = wire.Server(secret, self._handle, name="fuzz-server")

    def _handle(self, channel: wire.Channel) -> None:
        while True:
            try:
                channel.recv()
            except BaseException as exc:
                self.errors.append(exc)
                raise


class Job:
    """A test job's secret and server (its repr shows neither: Hypothesis prints it)."""

    def __init__(self):
        self.secret = new_secret()
        self.recorder = Recorder(self.secret)

    def __iter__(self):
        return iter((self.secret, self.recorder))

    def __repr__(self) -> str:
        return "Job()"


@pytest.fixture(scope="module")
def job():
    job = Job()
    yield job
    job.recorder.server.close()


@pytest.fixture(scope="module")
def driver():
    state = JobState(JobSpec("job", 2, b"payload", False, "all"))
    secret = new_secret()
    service = DriverService(state, secret, "127.0.0.1", "127.0.0.1")
    yield Driver(secret, service)
    service.close()


class Driver(NamedTuple):
    secret: JobSecret
    service: DriverService

    def __repr__(self) -> str:
        return "Driver()"


def _read_to_end(sock: socket.socket) -> bytes:
    """What the server still sends before it closes (it must close within the timeout)."""
    sock.settimeout(READ_TIMEOUT_S)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, ssl.SSLError):
            return data
        except TimeoutError:
            pytest.fail("the server neither answered nor closed the connection")
        if not chunk:
            return data
        data += chunk


def _still_serves(secret: JobSecret, recorder: Recorder) -> None:
    ended = len(recorder.errors)
    channel = wire.connect(recorder.server.address, secret)
    token = os.urandom(4).hex()
    channel.send(Tripwire(token, 0))
    channel.close()
    assert _wait_for(lambda: (token, 0) in FIRED and len(recorder.errors) > ended)


def _wait_for(condition, timeout_s: float = READ_TIMEOUT_S) -> bool:
    event = threading.Event()
    for _ in range(int(timeout_s * 100)):
        if condition():
            return True
        event.wait(0.01)
    return condition()


def _frame(key: bytes, seq: int, body: bytes) -> bytes:
    mac = wire._mac(key, b"c", struct.pack("!Q", seq), body)
    return struct.pack("!Q", len(body)) + mac + body


@FUZZ
@given(
    order=st.lists(st.integers(0, 4), min_size=1, max_size=6),
    damage=st.one_of(
        st.none(),
        st.tuples(
            st.integers(0, 5),
            st.sampled_from(["flip", "truncate", "oversize", "garbage"]),
            st.integers(0, 1 << 16),
        ),
    ),
)
def test_reordered_replayed_or_damaged_frames_are_never_unpickled(job, order, damage):
    """Frames made with the right session key, sent out of order, twice, cut short,
    with a flipped bit, a huge declared size or junk: only the frames before the first
    fault are loaded, then the server hangs up."""
    secret, recorder = job
    token = os.urandom(6).hex()
    channel = wire.connect(recorder.server.address, secret)
    frames = [_frame(channel._frames._key, i, pickle.dumps(Tripwire(token, i))) for i in range(5)]
    stream, expected, in_order = [], [], True
    for position, index in enumerate(order):
        frame = frames[index]
        broken = damage is not None and damage[0] == position
        if broken:
            kind, amount = damage[1], damage[2]
            if kind == "flip":
                at = amount % len(frame)
                frame = frame[:at] + bytes([frame[at] ^ (1 + amount % 255)]) + frame[at + 1 :]
            elif kind == "truncate":
                frame = frame[: amount % len(frame)]
            elif kind == "oversize":
                frame = struct.pack("!Q", (1 << 62) + amount) + frame[8:]
            else:
                frame = os.urandom(amount % 200)
        stream.append(frame)
        in_order = in_order and index == position and not broken
        if in_order:
            expected.append((token, index))
        if broken:
            break
    ended = len(recorder.errors)
    try:
        channel.sock.sendall(b"".join(stream))
    except OSError:
        pass  # the server already hung up at the fault
    channel.close()  # a frame cut short (or a made-up size) ends with the stream
    assert _wait_for(lambda: len(recorder.errors) > ended), "the server kept the channel"
    assert [f for f in FIRED if f[0] == token] == expected
    _still_serves(secret, recorder)


@FUZZ
@given(data=st.binary(max_size=512))
def test_plain_tcp_bytes_are_refused(job, data):
    secret, recorder = job
    before = len(FIRED)
    with socket.create_connection(recorder.server.address) as sock:
        try:
            sock.sendall(data + pickle.dumps(Tripwire("plain", 0)))
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # refused already
        reply = _read_to_end(sock)
    # Whatever came back is TLS's own alert, never a sparkdist nonce or frame.
    assert len(reply) < 64
    assert len(FIRED) == before


@FUZZ
@given(data=st.binary(min_size=wire.NONCE_BYTES + wire.MAC_BYTES, max_size=512))
def test_tls_client_without_the_secret_is_refused(job, data):
    """It may know the certificate (it is no secret): it still proves nothing. (An
    answer shorter than nonce + MAC waits for the rest up to HANDSHAKE_TIMEOUT_S.)"""
    secret, recorder = job
    before = len(FIRED)
    raw = socket.create_connection(recorder.server.address, timeout=READ_TIMEOUT_S)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with context.wrap_socket(raw) as tls:
        presented = hashlib.sha256(tls.getpeercert(binary_form=True)).digest()
        assert presented == secret.pin
        assert len(tls.recv(wire.NONCE_BYTES)) > 0  # the server's nonce
        tls.sendall(data + pickle.dumps(Tripwire("no-secret", 0)))
        assert _read_to_end(tls) == b""
    assert len(FIRED) == before


def test_wrong_secret_with_the_right_certificate_is_refused(job):
    secret, recorder = job
    impostor = JobSecret(os.urandom(32), secret.pin)
    with pytest.raises(wire.AuthenticationError, match="secret"):
        wire.connect(recorder.server.address, impostor)
    _still_serves(secret, recorder)


def test_client_refuses_a_forged_or_stale_certificate_before_sending_anything(job):
    """A server with another key (forged, or a previous job's) gets no byte from a
    client of this job: the pin is checked right after the TLS handshake."""
    secret, _ = job
    for other in (new_secret(), JobSecret(secret.hmac_key, *_fields(new_secret()))):
        listener = socket.create_server(("127.0.0.1", 0))
        received: list[bytes] = []

        def impersonate(other=other, listener=listener, received=received):
            conn, _ = listener.accept()
            with other.server_context().wrap_socket(conn, server_side=True) as tls:
                tls.settimeout(READ_TIMEOUT_S)
                tls.sendall(os.urandom(wire.NONCE_BYTES))
                try:
                    received.append(tls.recv(1024))
                except (OSError, ssl.SSLError):
                    received.append(b"")

        thread = threading.Thread(target=impersonate)
        thread.start()
        with pytest.raises(wire.AuthenticationError, match="not this job's"):
            wire.connect(listener.getsockname()[:2], secret.for_clients())
        thread.join(READ_TIMEOUT_S)
        listener.close()
        assert received == [b""]


def test_server_without_tls_is_refused_by_a_tls_client(job):
    secret, _ = job
    plain = wire.Server(JobSecret(secret.hmac_key), lambda channel: channel.recv())
    try:
        with pytest.raises(wire.AuthenticationError, match="TLS handshake"):
            wire.connect(plain.address, secret)
    finally:
        plain.close()


def _fields(secret: JobSecret) -> tuple:
    return secret.pin, secret.certificate, secret.private_key


_tags = st.sampled_from(sorted(messages._KINDS)) | st.text(max_size=12)
_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@FUZZ
@given(
    raw=st.one_of(
        _values,
        st.tuples(_tags).flatmap(
            lambda tag: st.lists(_values, max_size=4).map(lambda rest: (*tag, *rest))
        ),
    )
)
def test_driver_service_answers_any_first_message_without_crashing(driver, raw, caplog):
    """Authenticated but not a hello: a `Rejected` reply saying why, then a closed
    channel; the handler never fails and the service keeps serving."""
    try:
        messages.decode(raw, messages.HELLOS)
        assume(False)  # a well-formed hello is served, not refused
    except messages.MalformedMessage:
        pass
    secret, service = driver
    caplog.set_level(logging.WARNING)
    caplog.clear()
    channel = wire.connect(service.address, secret)
    channel.sock.settimeout(READ_TIMEOUT_S)
    channel.send(raw)
    reply = messages.decode(channel.recv(), (messages.Rejected,))
    assert reply.reason
    with pytest.raises((EOFError, ConnectionError)):
        channel.recv()
    channel.close()
    assert "handler failed" not in caplog.text


def test_driver_service_serves_a_rank_after_the_fuzzing(driver):
    secret, service = driver
    good = wire.connect(service.address, secret)
    good.send(messages.encode(messages.RankHello(1, "127.0.0.1", os.getpid())))
    good.sock.settimeout(READ_TIMEOUT_S)
    assert messages.decode(good.recv(), messages.RANK_REPLIES).payload == b"payload"
    good.close()
