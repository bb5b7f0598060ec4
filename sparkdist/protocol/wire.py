"""Encrypted, authenticated message channels between the driver, task agents and ranks.

Every control channel of a job is a TCP connection, wrapped in TLS 1.3 with the job's
own certificate (`job_secret`: the client refuses any server whose certificate is not
the job's before it sends anything), and authenticated inside it with the job's secret:

* handshake: the server sends a random nonce, the client answers with its own nonce
  and an HMAC-SHA256 of both under the secret, the server proves itself the same way;
  both sides then derive a session key from the two nonces;
* every frame afterwards carries HMAC-SHA256(session key, direction, sequence number,
  body), so a frame can be neither forged, replayed nor reordered;
* the body is unpickled only after its MAC has been checked.

A peer without the secret never gets past the handshake, so nothing it sends is
ever unpickled or acted upon. A job started with TLS off (`job_secret.TLS_ENV`) runs
the same handshake and frames over plain TCP.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import pickle
import select
import socket
import ssl
import struct
import threading
from collections.abc import Callable
from typing import Any

from sparkdist.protocol.job_secret import JobSecret, client_context, new_secret

__all__ = [
    "AuthenticationError",
    "Channel",
    "Frames",
    "JobSecret",
    "Server",
    "connect",
    "new_secret",
]

logger = logging.getLogger(__name__)

NONCE_BYTES = 32
MAC_BYTES = 32
HANDSHAKE_TIMEOUT_S = 10.0
# A peer whose host died or whose network was cut never closes its connection. TCP
# keepalive probes (answered by the peer's kernel, so a busy peer is never mistaken for a
# dead one) and a bound on unacknowledged data turn that silence into an error on the
# channel after about DEAD_PEER_S seconds, on both ends.
DEAD_PEER_S = 15
_KEEPALIVE_IDLE_S = 5
_KEEPALIVE_INTERVAL_S = 2
_HEADER = struct.Struct("!Q")
_PREALLOCATE_BYTES = 64 << 20


class AuthenticationError(ConnectionError):
    """The peer does not hold the job's secret, or a frame was tampered with."""


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    if size <= 64:
        buffer = bytearray()
        while len(buffer) < size:
            chunk = sock.recv(size - len(buffer))
            if not chunk:
                raise EOFError("connection closed by peer")
            buffer += chunk
        return bytes(buffer)
    if size > _PREALLOCATE_BYTES:  # grow as data arrives: a size alone allocates nothing
        return b"".join(
            _recv_exact(sock, min(_PREALLOCATE_BYTES, size - start))
            for start in range(0, size, _PREALLOCATE_BYTES)
        )
    buffer = bytearray(size)
    view = memoryview(buffer)
    received = 0
    while received < size:
        count = sock.recv_into(view[received:], min(size - received, 1 << 20))
        if not count:
            raise EOFError("connection closed by peer")
        received += count
    return buffer


class Frames:
    """The MAC'd frames of one authenticated channel, whatever carries them: the blocking
    `Channel` here and the driver's event-driven channels
    (`runner/driver/event_server.py`) share it.

    A frame is its body's length, HMAC-SHA256(session key, direction, sequence number,
    body), then the body (a pickle), which is unpickled only after its MAC checks out.
    """

    HEADER_BYTES = _HEADER.size + MAC_BYTES

    def __init__(self, session_key: bytes, is_client: bool):
        self._key = session_key
        self._out_tag = b"c" if is_client else b"s"
        self._in_tag = b"s" if is_client else b"c"
        self._out_seq = 0
        self._in_seq = 0

    def seal(self, message: Any) -> tuple[bytes, bytes]:
        """(header, body) of the next outgoing frame: sent in the order sealed."""
        body = self.body(message)
        return self.header(body), body

    @staticmethod
    def body(message: Any) -> bytes:
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)

    def header(self, body: bytes) -> bytes:
        """The header of the next outgoing frame, whose body is `body`."""
        seq = struct.pack("!Q", self._out_seq)
        self._out_seq += 1
        return _HEADER.pack(len(body)) + _mac(self._key, self._out_tag, seq, body)

    @staticmethod
    def body_size(header: bytes) -> int:
        """The body's length, from a frame's first `HEADER_BYTES` bytes."""
        return _HEADER.unpack(header[: _HEADER.size])[0]

    def open(self, header: bytes, body: bytes, peer: str) -> Any:
        """The message of the next incoming frame, once its MAC checks out."""
        mac = header[_HEADER.size :]
        seq = struct.pack("!Q", self._in_seq)
        if not hmac.compare_digest(mac, _mac(self._key, self._in_tag, seq, body)):
            raise AuthenticationError(f"bad message authentication code from {peer}")
        self._in_seq += 1
        return pickle.loads(body)


class Channel:
    """One authenticated, ordered, bidirectional message stream.

    `send` is safe from several threads; `recv` is meant for one reader thread.
    """

    def __init__(self, sock: socket.socket, session_key: bytes, is_client: bool):
        self.sock = sock
        self._frames = Frames(session_key, is_client)
        self._send_lock = threading.Lock()
        self.peer = peer_name(sock)

    def send(self, message: Any) -> None:
        with self._send_lock:
            header, body = self._frames.seal(message)
            self.sock.sendall(header + body)

    def recv(self) -> Any:
        header = _recv_exact(self.sock, Frames.HEADER_BYTES)
        body = _recv_exact(self.sock, Frames.body_size(header))
        return self._frames.open(header, body, self.peer)

    def wait_readable(self) -> None:
        """Block until the peer sends something or goes away; reads nothing."""
        try:
            select.select([self.sock], [], [])
        except (OSError, ValueError):  # closed meanwhile
            pass

    def request(self, message: Any) -> Any:
        """Send a message and wait for the reply (for channels used one call at a time)."""
        self.send(message)
        return self.recv()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def tune(sock: socket.socket) -> None:
    """No Nagle delay for small control messages; detect a dead peer (see DEAD_PEER_S)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):  # Linux
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, _KEEPALIVE_IDLE_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, _KEEPALIVE_INTERVAL_S)
        probes = max(1, (DEAD_PEER_S - _KEEPALIVE_IDLE_S) // _KEEPALIVE_INTERVAL_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, probes)
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, DEAD_PEER_S * 1000)


def peer_name(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"


def _client_handshake(sock: socket.socket, secret: bytes) -> bytes:
    server_nonce = _recv_exact(sock, NONCE_BYTES)
    client_nonce = os.urandom(NONCE_BYTES)
    sock.sendall(client_nonce + _mac(secret, b"client", server_nonce, client_nonce))
    try:
        proof = _recv_exact(sock, MAC_BYTES)
    except EOFError as exc:
        raise AuthenticationError(
            "the server closed the connection during authentication (wrong job secret?)"
        ) from exc
    if not hmac.compare_digest(proof, _mac(secret, b"server", client_nonce, server_nonce)):
        raise AuthenticationError("the server does not hold this job's secret")
    return _mac(secret, b"session", server_nonce, client_nonce)


def server_nonce() -> bytes:
    """The server's first handshake message: a fresh nonce."""
    return os.urandom(NONCE_BYTES)


ANSWER_BYTES = NONCE_BYTES + MAC_BYTES
"""The size of the client's answer to `server_nonce`."""


def server_check(secret: bytes, nonce: bytes, answer: bytes) -> tuple[bytes, bytes]:
    """Check the client's answer to `nonce`; (the server's proof to send back, the
    session key). Raises `AuthenticationError` if the client lacks the secret."""
    client_nonce, proof = answer[:NONCE_BYTES], answer[NONCE_BYTES:]
    if not hmac.compare_digest(proof, _mac(secret, b"client", nonce, client_nonce)):
        raise AuthenticationError("the client does not hold this job's secret")
    return _mac(secret, b"server", client_nonce, nonce), _mac(
        secret, b"session", nonce, client_nonce
    )


def _server_handshake(sock: socket.socket, secret: bytes) -> bytes:
    nonce = server_nonce()
    sock.sendall(nonce)
    proof, key = server_check(secret, nonce, _recv_exact(sock, ANSWER_BYTES))
    sock.sendall(proof)
    return key


def _client_tls(sock: socket.socket, pin: bytes) -> ssl.SSLSocket:
    """TLS to a server that must present the job's certificate; anything else is refused
    before this client sends a byte of its own."""
    where = peer_name(sock)
    try:
        tls = client_context().wrap_socket(sock)
    except (ssl.SSLError, EOFError, ConnectionResetError) as exc:
        raise AuthenticationError(
            f"TLS handshake with {where} failed ({exc}): it is not a sparkdist server of "
            "this job, or it runs without TLS (SPARKDIST_TLS=0 on one side only)"
        ) from exc
    presented = tls.getpeercert(binary_form=True) or b""
    if not hmac.compare_digest(hashlib.sha256(presented).digest(), pin):
        tls.close()
        raise AuthenticationError(
            f"the server at {where} presented a certificate that is not this job's: refused"
        )
    return tls


def connect(address: tuple[str, int], secret: JobSecret, timeout: float = 30.0) -> Channel:
    """Open an encrypted, authenticated channel to a `Server` of the same job."""
    sock = socket.create_connection(address, timeout=timeout)
    try:
        sock.settimeout(HANDSHAKE_TIMEOUT_S)
        if secret.pin is not None:
            sock = _client_tls(sock, secret.pin)
        key = _client_handshake(sock, secret.hmac_key)
        sock.settimeout(None)
        tune(sock)
    except BaseException:
        sock.close()
        raise
    return Channel(sock, key, is_client=True)


class Server:
    """Accepts authenticated channels and hands each to `handler` in its own thread.

    Connections that fail the TLS or the HMAC handshake are logged and dropped before
    any of their bytes are interpreted.
    """

    def __init__(
        self,
        secret: JobSecret,
        handler: Callable[[Channel], None],
        host: str = "127.0.0.1",
        port: int = 0,
        name: str = "sparkdist-server",
    ):
        self._secret = secret
        self._tls = secret.server_context() if secret.tls else None
        self._handler = handler
        self._name = name
        self._sock = socket.create_server((host, port), backlog=128)
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name=name, daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(
                target=self._serve, args=(sock,), name=f"{self._name}-conn", daemon=True
            ).start()

    def _serve(self, sock: socket.socket) -> None:
        peer = peer_name(sock)
        try:
            sock.settimeout(HANDSHAKE_TIMEOUT_S)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_side=True)
            key = _server_handshake(sock, self._secret.hmac_key)
            sock.settimeout(None)
            tune(sock)
        except (OSError, EOFError, AuthenticationError) as exc:
            logger.warning("%s: rejected a connection from %s: %s", self._name, peer, exc)
            sock.close()
            return
        channel = Channel(sock, key, is_client=False)
        try:
            self._handler(channel)
        except (EOFError, ConnectionError, OSError):
            pass
        except Exception:
            logger.exception("%s: handler failed for %s", self._name, channel.peer)
        finally:
            channel.close()

    def close(self) -> None:
        self._closed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
