"""What a backend sees of its rank, and what it must do.

A backend's only job is to prepare a rank's environment for one framework before
the user's function runs (as Ray Train's Backend does): set the variables the
framework reads, and run any rendezvous it needs through the driver.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol


class Rendezvous(Protocol):
    """The rank's link to the driver: values shared by the ranks of one job, and files
    for the driver."""

    def put(self, key: str, value: Any) -> None: ...

    def get(self, key: str, timeout_s: float = ...) -> Any: ...

    def send_file(self, name: str, data: bytes) -> None: ...


@dataclass
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    host: str
    """The address of this rank's task (the interface all ranks can reach)."""
    launcher: str
    """"mpi" (ranks started by mpirun) or "direct"."""
    rendezvous: Rendezvous
    env: MutableMapping[str, str]


class Backend(Protocol):
    name: str

    def prepare(self, ctx: RankContext) -> None:
        """Set up `ctx.env` for this framework; called in every rank before `main`."""
