"""Per-framework preparation of each rank's environment (see `base.py`).

Order matters only where one backend reads what another sets: GPUs first (the others
may look at CUDA_VISIBLE_DEVICES), then one backend per framework. Each is cheap when
its framework is not installed or not used.
"""

from __future__ import annotations

import sys
from collections.abc import MutableMapping

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


FRAMEWORKS = {
    "horovod": ("horovod.torch", "horovod.tensorflow", "horovod.keras"),
    "torch": ("torch.distributed",),
    "tensorflow": ("tensorflow",),
    "mpi4py": ("mpi4py.MPI",),
}


def frameworks_in_use() -> list[str]:
    """Which distributed frameworks `main` imported (reported for the job's record)."""
    return [name for name, modules in FRAMEWORKS.items() if any(m in sys.modules for m in modules)]


def rank_context(rendezvous, place, env: MutableMapping[str, str]) -> RankContext:
    """This rank's place in the job (a `job_environment.TaskEnvironment`, and the
    variables its supervisor set), with the `rendezvous` its backends use."""
    return RankContext(
        rank=int(env["RANK"]),
        world_size=int(env["WORLD_SIZE"]),
        local_rank=int(env["LOCAL_RANK"]),
        local_world_size=int(env["LOCAL_WORLD_SIZE"]),
        node_rank=int(env["NODE_RANK"]),
        num_nodes=place.num_nodes,
        host=place.task_host,
        launcher=place.job.launcher,
        rendezvous=rendezvous,
        env=env,
    )


def prepare_rank(ctx: RankContext) -> None:
    """Run every backend's preparation, in order, before the user's function."""
    for backend in BACKENDS:
        backend.prepare(ctx)


__all__ = [
    "BACKENDS",
    "Backend",
    "RankContext",
    "frameworks_in_use",
    "prepare_rank",
    "rank_context",
]
