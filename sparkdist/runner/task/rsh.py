"""mpirun's rsh agent: `python -S -I .../rsh.py TASK-NAME COMMAND...`.

mpirun calls it as it would call `ssh HOST COMMAND` to start its daemon on HOST, once
per task, so it is kept light: run by file path with `-S -I`, it imports `os`, `sys` and
the C half of `socket` (`_socket`: `socket.py` and its enum and selectors imports were
half of this agent's CPU) and nothing of sparkdist (no ssl, no protocol),
and hands the call to task 0's launch relay (`rsh_relay.LaunchRelay`, a thread of the
Python process that started mpirun), which does the authenticated part. The relay's
Unix socket and the job's relay token come from the environment mpirun inherited
(`RELAY`, `TOKEN`), never from the command line. It relays the daemon's output to
stderr and exits with the daemon's exit code, as ssh would.

The relay's wire format is defined here, the one place both ends import: the request is
one frame (`REQUEST`) of NUL-separated token and argv; the replies are frames of
`OUTPUT` (the daemon's bytes), then one `EXIT` (the exit status, decimal) or `ERROR`
(why the relay refused, then exit 255).
"""

import _socket
import os
import sys

RELAY = "SPARKDIST_RSH_RELAY"
"""The relay's Unix socket (as `job_environment.RSH_RELAY`; this file imports nothing)."""
TOKEN = "SPARKDIST_RSH_TOKEN"
"""The job's relay token (as `job_environment.RSH_TOKEN`)."""

REQUEST, OUTPUT, EXIT, ERROR = b"R", b"O", b"X", b"E"
MAX_FRAME = 1 << 20


def frame(kind: bytes, body: bytes) -> bytes:
    """One frame: its kind (one byte), the body's length (4 bytes, big-endian), the body."""
    return kind + len(body).to_bytes(4, "big") + body


def read_frame(sock: _socket.socket) -> tuple[bytes, bytes]:
    """The next frame's (kind, body); EOFError if the peer closed first."""
    head = _read_exact(sock, 5)
    size = int.from_bytes(head[1:], "big")
    if size > MAX_FRAME:
        raise EOFError(f"frame of {size} bytes")
    return head[:1], _read_exact(sock, size)


def _read_exact(sock: _socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("the relay closed the connection")
        data += chunk
    return data


def encode_request(token: str, argv: list[str]) -> bytes:
    return b"\0".join(os.fsencode(part) for part in [token, *argv])


def decode_request(body: bytes) -> tuple[str, list[str]]:
    token, *argv = [os.fsdecode(part) for part in body.split(b"\0")]
    return token, argv


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        sys.stderr.write("usage: rsh.py TASK-NAME COMMAND...\n")
        return 2
    path, token = os.environ.get(RELAY), os.environ.get(TOKEN)
    if not path or not token:
        sys.stderr.write(f"sparkdist rsh: {RELAY} and {TOKEN} must be set (by task 0)\n")
        return 255
    try:
        return _call(path, token, argv)
    except (EOFError, OSError) as exc:
        sys.stderr.write(f"sparkdist rsh: task 0's launch relay: {exc}\n")
        return 255


def _call(path: str, token: str, argv: list[str]) -> int:
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(path)
        sock.sendall(frame(REQUEST, encode_request(token, argv)))
        while True:
            kind, body = read_frame(sock)
            if kind == OUTPUT:
                sys.stderr.buffer.write(body)
                sys.stderr.flush()
            elif kind == EXIT:
                return int(body)
            else:
                sys.stderr.write(f"sparkdist rsh: {body.decode(errors='replace')}\n")
                return 255
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
