"""The open channels from the driver to a job's tasks and rank supervisors, and the
orders (`Finish`, `Abort`, every task's agent place) the driver sends over them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import NamedTuple

from sparkdist.protocol import messages, wire

Peer = tuple[str, int]
"""("task", index) or ("supervisor", rank)."""


class Peers:
    """The channels of the connected peers, under the job's lock."""

    def __init__(self, cond: threading.Condition):
        self.cond = cond
        self._channels: dict[Peer, wire.Channel] = {}

    def add(self, kind: str, number: int, channel: wire.Channel) -> None:
        with self.cond:
            self._channels[(kind, number)] = channel

    def remove(self, kind: str, number: int) -> None:
        with self.cond:
            self._channels.pop((kind, number), None)

    def channel(self, kind: str, number: int) -> wire.Channel | None:
        with self.cond:
            return self._channels.get((kind, number))

    def select(self, wanted: Callable[[str, int], bool]) -> list[wire.Channel]:
        """The channels of the peers `wanted(kind, number)` picks."""
        with self.cond:
            return [c for (kind, number), c in self._channels.items() if wanted(kind, number)]


def send(channels: Iterable[wire.Channel], order: NamedTuple) -> None:
    """Send `order` to each channel; a peer gone already is skipped (its loss is
    reported by its own handler)."""
    data = messages.encode(order)
    for channel in channels:
        try:
            channel.send(data)
        except OSError:
            pass
