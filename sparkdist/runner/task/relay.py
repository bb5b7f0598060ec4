"""A task's local relay: its supervisors and ranks reach the driver through it, so that
the driver holds one connection per Spark task (per host), not three per rank.

The relay is a `wire.Server` on the task's host (127.0.0.1: everything the task starts
runs beside it), with the job's TLS certificate and HMAC secret like every channel of
the job: a local process without the secret gets nothing. Each local connection becomes
a stream of the task's own authenticated channel to the driver: what the peer sends goes
up as `Relayed(stream, message)`, what the driver sends it comes down the same way, and
the end of either side is a `RelayClosed(stream)`, so that the driver sees a local peer
that disconnects exactly as it sees a lost direct connection. The task's channel lost,
every local connection is closed.

The payload crosses the driver's network once per task: the driver sends it in the first
rank's `Welcome` through a relay and empty in the next ones, which the relay fills in; a
warm world's runs (`WarmRun`) likewise, run by run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from sparkdist.protocol import messages, wire

logger = logging.getLogger(__name__)

LOCAL_HOST = "127.0.0.1"


class HostRelay:
    """One task's relay. `upstream` sends a message on the task's channel to the driver
    (safe from several threads; raises OSError once the driver is gone); the task hands
    the driver's `Relayed` and `RelayClosed` frames to `deliver`. Local peers connect to
    `address` (the task puts it in their environment as the driver's address)."""

    def __init__(self, secret: wire.JobSecret, upstream: Callable[[NamedTuple], None]):
        self._upstream = upstream
        self._streams: dict[int, wire.Channel] = {}
        self._next_stream = 0
        self._lock = threading.Lock()
        self._payload = b""
        self._warm_payload = (0, b"")
        """The last warm run's number and payload."""
        self._server = wire.Server(secret, self._serve, host=LOCAL_HOST, name="sparkdist-relay")
        self.address = f"{LOCAL_HOST}:{self._server.address[1]}"

    def _serve(self, channel: wire.Channel) -> None:
        """Forward one local peer's messages up until its connection ends (a thread of
        `wire.Server` per local peer)."""
        with self._lock:
            stream, self._next_stream = self._next_stream, self._next_stream + 1
            self._streams[stream] = channel
        try:
            while True:
                self._upstream(messages.Relayed(stream, channel.recv()))
        finally:
            if self._forget(stream) is not None:  # ended here, not by the driver
                self._tell_driver_closed(stream)

    def deliver(self, frame: messages.Relayed | messages.RelayClosed) -> None:
        """A frame from the driver for one local peer (in the order they came)."""
        if isinstance(frame, messages.RelayClosed):
            channel = self._forget(frame.stream)
            if channel is not None:
                channel.close()
            return
        body = self._with_payload(frame.body)  # kept even if its rank is gone already
        with self._lock:
            channel = self._streams.get(frame.stream)
        if channel is None:
            return  # that peer is gone already; the driver learns it from RelayClosed
        try:
            channel.send(body)
        except OSError:
            pass  # its serving thread sees the end and reports it

    def _with_payload(self, body: Any) -> Any:
        """A `Welcome` keeps its payload here once; an empty one gets that payload. A
        warm run's order (`WarmRun`) likewise, for its run."""
        tag = body[0] if isinstance(body, tuple) and body else None
        if tag == messages.Welcome.tag:
            welcome = messages.decode(body, (messages.Welcome,))
            if welcome.payload:
                self._payload = welcome.payload
                return body
            return messages.encode(welcome._replace(payload=self._payload))
        if tag == messages.WarmRun.tag:
            order = messages.decode(body, (messages.WarmRun,))
            if order.payload:
                self._warm_payload = (order.run, order.payload)
                return body
            run, payload = self._warm_payload
            if run == order.run:
                return messages.encode(order._replace(payload=payload))
        return body

    def _forget(self, stream: int) -> wire.Channel | None:
        with self._lock:
            return self._streams.pop(stream, None)

    def _tell_driver_closed(self, stream: int) -> None:
        try:
            self._upstream(messages.RelayClosed(stream))
        except OSError:
            pass  # the driver is gone: it counts every stream of this task as lost

    def close(self) -> None:
        """Stop accepting and close every local connection, telling the driver of those
        still open (before the task says it is done)."""
        self._server.close()
        with self._lock:
            streams, self._streams = self._streams, {}
        for stream, channel in streams.items():
            channel.close()
            self._tell_driver_closed(stream)
