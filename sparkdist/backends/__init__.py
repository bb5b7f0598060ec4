"""Per-framework preparation of each rank's environment (see `base.py`).

Order matters only where one backend reads what another sets: GPUs first (the others
may look at CUDA_VISIBLE_DEVICES), then one backend per framework. Each is cheap when
its framework is not installed or not used.
"""

from __future__ import annotations

from sparkdist.backends.base import Backend, RankContext
from sparkdist.backends.gpu import GpuBackend
from sparkdist.backends.horovod import HorovodBackend
from sparkdist.backends.mpi import MpiBackend
from sparkdist.backends.tensorflow import TensorFlowBackend
from sparkdist.backends.timeline import TimelineBackend
from sparkdist.backends.torch import TorchBackend
from sparkdist.backends.torchrun import TorchrunBackend

BACKENDS: list[Backend] = [
    GpuBackend(),
    TorchBackend(),
    TorchrunBackend(),
    TensorFlowBackend(),
    HorovodBackend(),
    TimelineBackend(),
    MpiBackend(),
]


def prepare_rank(ctx: RankContext) -> None:
    """Run every backend's preparation, in order, before the user's function."""
    for backend in BACKENDS:
        backend.prepare(ctx)


__all__ = ["BACKENDS", "Backend", "RankContext", "prepare_rank"]
