"""Per-framework preparation of each rank's environment (see `base.py`)."""

from __future__ import annotations

from sparkdist.backends.base import Backend, RankContext
from sparkdist.backends.torch import TorchBackend

BACKENDS: list[Backend] = [TorchBackend()]


def prepare_rank(ctx: RankContext) -> None:
    """Run every backend's preparation, in order, before the user's function."""
    for backend in BACKENDS:
        backend.prepare(ctx)


__all__ = ["BACKENDS", "Backend", "RankContext", "prepare_rank"]
