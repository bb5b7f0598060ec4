"""MPI (mpi4py): nothing to set under mpirun, MPI finalised at exit; a clear error without it.

Why there is nothing to set under the mpi launcher: the ranks are started by Open MPI's
daemons, so `MPI_Init` (mpi4py initialises MPI when `mpi4py.MPI` is imported) finds
everything it needs in the OMPI_* variables mpirun gave them, including the interfaces
pinned on mpirun's command line. `MPI.COMM_WORLD` then spans every rank of the job.

Why finalise: mpirun treats a rank that exits without MPI_Finalize as failed, and
mpi4py finalises from a C-level exit hook, which a rank that leaves through `os._exit`
(as sparkdist's does, to skip the interpreter's slow teardown) never reaches. A Python
`atexit` handler registered here, before the user's code, finalises MPI if mpi4py
initialised it, after every handler the user's code registered (Horovod's shutdown).

Why an error under the direct launcher: there each rank is a plain process, and
`MPI_Init` would quietly make it a singleton, so `MPI.COMM_WORLD.Get_size()` would be 1
in a job of N ranks and collectives would "succeed" on one process. Instead, importing
`mpi4py.MPI` in a multi-rank direct job raises an ImportError that says why and what to
do (launcher="mpi"). Code that treats mpi4py as optional (`except ImportError`) goes on
without it.
"""

from __future__ import annotations

import atexit
import importlib.abc
import logging
import sys

from sparkdist.backends.base import RankContext
from sparkdist.backends.import_hooks import refusing_spec

logger = logging.getLogger(__name__)

GUARDED_MODULE = "mpi4py.MPI"


class MpiUnavailableFinder(importlib.abc.MetaPathFinder):
    """Refuses `mpi4py.MPI` in a rank that mpirun did not start."""

    def __init__(self, world_size: int):
        self.world_size = world_size

    def find_spec(self, fullname, path=None, target=None):
        if fullname != GUARDED_MODULE:
            return None
        return refusing_spec(
            fullname,
            f"mpi4py.MPI is not available in this job: its {self.world_size} ranks were "
            'started by the direct launcher (HorovodRunner(launcher="direct"), or "auto" '
            "without Open MPI's mpirun), so MPI.COMM_WORLD would hold only this one process. "
            'Use HorovodRunner(..., launcher="mpi") (needs Open MPI on every node) for MPI '
            "code; torch.distributed, Horovod (over Gloo) and TensorFlow work with either "
            "launcher.",
        )


def finalize_mpi() -> None:
    """MPI_Finalize, if mpi4py initialised MPI in this process and nobody finalised it."""
    mpi = sys.modules.get(GUARDED_MODULE)
    if mpi is None:
        return
    try:
        if mpi.Is_initialized() and not mpi.Is_finalized():
            mpi.Finalize()
    except Exception:  # noqa: BLE001 - the rank's result is already with the driver
        logger.warning("MPI_Finalize failed", exc_info=True)


class MpiBackend:
    name = "mpi"

    def prepare(self, ctx: RankContext) -> None:
        if ctx.launcher == "mpi" or ctx.world_size == 1:
            atexit.register(finalize_mpi)
            return
        if not any(isinstance(f, MpiUnavailableFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, MpiUnavailableFinder(ctx.world_size))
