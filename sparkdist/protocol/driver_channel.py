"""A rank's channel to the driver, and `log_to_driver`, which user code calls.

In `protocol` because rank-side library code (checkpoint, report) uses it as much as the
rank's entry point does; kept small so that user code can import it cheaply.
"""

from __future__ import annotations

import threading
from typing import Any

from sparkdist.network import split_address
from sparkdist.protocol import messages, wire

RENDEZVOUS_TIMEOUT_S = 600.0


class DriverClient:
    """The rank's request/response channel to the driver; safe across threads."""

    def __init__(self, address: str, secret: wire.JobSecret):
        self._channel = wire.connect(split_address(address), secret)
        self._lock = threading.Lock()

    def request(self, message: Any) -> Any:
        """Send one `messages` record; its reply (`Ok`, `Missing`, `Failed`, `Welcome`).
        Raises `messages.RequestRejected` if the driver refused it."""
        with self._lock:
            raw = self._channel.request(messages.encode(message))
        return messages.reply_to(raw, messages.RANK_REPLIES)

    def put(self, key: str, value: Any) -> None:
        self.request(messages.KvPut(key, value))

    def get(self, key: str, timeout_s: float = RENDEZVOUS_TIMEOUT_S) -> Any:
        reply = self.request(messages.KvGet(key, float(timeout_s)))
        if not isinstance(reply, messages.Ok):
            raise TimeoutError(f"rendezvous value {key!r} did not arrive within {timeout_s}s")
        return reply.value

    def send_file(self, name: str, data: bytes) -> None:
        self.request(messages.FileUpload(name, data))


_client: DriverClient | None = None


def connect(address: str, secret: wire.JobSecret) -> DriverClient:
    """Open this rank's channel (once per rank process)."""
    global _client
    _client = DriverClient(address, secret)
    return _client


def driver_client() -> DriverClient | None:
    """The channel to the driver inside a sparkdist rank, else None."""
    return _client


def log_to_driver(message: str) -> None:
    """Send `message` to the driver's output, prefixed with this rank.

    Meant for `HorovodRunner(driver_log_verbosity="log_callback_only")`, where it is
    the only rank output the driver shows (besides errors). Outside a sparkdist rank
    it prints to stdout.
    """
    if _client is None:
        print(message, flush=True)
        return
    _client.request(messages.Log(str(message)))
