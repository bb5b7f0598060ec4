"""A rank's channel to the driver, and `log_to_driver`, which user code calls.

In `protocol` because rank-side library code (checkpoint, report) uses it as much as the
rank's entry point does; kept small so that user code can import it cheaply.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from sparkdist.network import split_address
from sparkdist.protocol import messages, rank_trace, wire

RENDEZVOUS_TIMEOUT_S = 600.0
ALIVE_EVERY_S = 1.0
"""A rank tells the driver its step counts (`alive`) at most this often."""


class DriverClient:
    """The rank's request/response channel to the driver; safe across threads."""

    def __init__(self, address: str, secret: wire.JobSecret):
        self._channel = wire.connect(split_address(address), secret)
        self._lock = threading.Lock()
        self.secret = secret
        """The job's secret: a warm world's rank checks each run's payload with it."""
        self.key_prefix = ""
        """Before every rendezvous key: a warm world's run's own (`runner/rank/warm.py`),
        so that each run's backends and elastic worlds agree on fresh values."""

    def request(self, message: Any) -> Any:
        """Send one `messages` record; its reply (`Ok`, `Missing`, `Failed`, `Welcome`).
        Raises `messages.RequestRejected` if the driver refused it."""
        with self._lock:
            raw = self._channel.request(messages.encode(message))
        return messages.reply_to(raw, messages.RANK_REPLIES)

    def put(self, key: str, value: Any) -> None:
        self.request(messages.KvPut(self.key_prefix + key, value))

    def get(self, key: str, timeout_s: float = RENDEZVOUS_TIMEOUT_S) -> Any:
        reply = self.request(messages.KvGet(self.key_prefix + key, float(timeout_s)))
        if not isinstance(reply, messages.Ok):
            raise TimeoutError(f"rendezvous value {key!r} did not arrive within {timeout_s}s")
        return reply.value

    def send_file(self, name: str, data: bytes) -> None:
        self.request(messages.FileUpload(name, data))

    def try_request(self, message: Any) -> bool:
        """Send `message` unless another thread's request holds the channel (a blocked
        rendezvous read): a sign of life is dropped rather than waited for. Whether it
        went."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            self._channel.request(messages.encode(message))
        finally:
            self._lock.release()
        return True


_client: DriverClient | None = None


def connect(address: str, secret: wire.JobSecret) -> DriverClient:
    """Open this rank's channel (once per rank process)."""
    global _client
    _client = DriverClient(address, secret)
    for counter in _steps.values():
        counter.due = 0.0  # the counts so far go with the next step
    return _client


def driver_client() -> DriverClient | None:
    """The channel to the driver inside a sparkdist rank, else None."""
    return _client


class Steps:
    """The count of one kind of step ("batches": a data loader's, "commits": an elastic
    state's): a sign of life, and the step rate the driver names stragglers by.

    A hot loop adds to `count` itself and calls `tell` once `due` (`time.monotonic()`)
    has come, so that a step costs no call; `alive` does both for one step. Without a
    channel to the driver nothing is due: `connect` makes the counts due at the next step.
    """

    __slots__ = ("count", "due")

    def __init__(self) -> None:
        self.count = 0
        self.due = 0.0 if _client is not None else math.inf  # when the counts may next go

    def tell(self) -> None:
        """Send every kind's counts to the driver, at most once a second (`ALIVE_EVERY_S`)."""
        tell_if_due()
        self.due = math.inf if _client is None else _alive_sent + ALIVE_EVERY_S


_steps: dict[str, Steps] = {}
_alive_sent = 0.0


def send_alive(wait: bool) -> None:
    """Send every kind's step counts and the trace's events recorded since the last
    (`rank_trace`); `wait`: even if another thread's request holds the channel."""
    if _client is None:
        return
    counts = {kind: counter.count for kind, counter in _steps.items() if counter.count}
    events = rank_trace.drain()
    try:
        if wait:
            _client.request(messages.Alive(counts, events))
        elif not _client.try_request(messages.Alive(counts, events)):
            rank_trace.put_back(events)
    except (OSError, EOFError):
        pass  # the driver is gone: the rank learns it from its own requests


def tell_if_due() -> None:
    """Send the signs of life if a second passed since the last (`report` calls it)."""
    global _alive_sent
    now = time.monotonic()
    if _client is not None and now - _alive_sent >= ALIVE_EVERY_S:
        _alive_sent = now
        send_alive(wait=False)


def steps(kind: str) -> Steps:
    """The `Steps` of `kind`, one per process."""
    found = _steps.get(kind)
    if found is None:
        found = _steps[kind] = Steps()
    return found


def alive(kind: str) -> None:
    """One more step of `kind` (see `Steps`): at most once a second (`ALIVE_EVERY_S`)
    the counts go to the driver."""
    counter = steps(kind)
    counter.count += 1
    counter.tell()


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
