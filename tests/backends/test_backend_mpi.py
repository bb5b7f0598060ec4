"""MPI backend end to end: mpi4py's COMM_WORLD spans the job's ranks under the mpi
launcher (real mpirun started inside a Spark barrier stage, and on the driver), and a
direct-launched rank that imports mpi4py.MPI gets an error saying why, instead of a
silent world of one."""

from __future__ import annotations

import pytest
from installed import requires

from sparkdist import HorovodRunner, RankFailedError

pytestmark = requires("mpi4py", "pip install mpi4py (make venv)")


def mpi_main() -> dict:
    import os

    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    return {
        "rank": comm.Get_rank(),
        "size": comm.Get_size(),
        "sparkdist_rank": int(os.environ["RANK"]),
        "sum": comm.allreduce(comm.Get_rank() + 1, op=MPI.SUM),
        "gathered": comm.allgather(os.getpid()),
    }


@pytest.mark.parametrize("np_", [2, -2])
def test_comm_world_under_mpi_launcher(sc, np_):
    results = HorovodRunner(np=np_, launcher="mpi", timeout=300).run_all(mpi_main)
    assert [r["rank"] for r in results] == [0, 1]
    for r in results:
        assert r["size"] == 2 and r["rank"] == r["sparkdist_rank"]
        assert r["sum"] == 3
        assert len(set(r["gathered"])) == 2
    assert results[0]["gathered"] == results[1]["gathered"]


def test_mpi4py_refused_under_direct_launcher(sc):
    with pytest.raises(RankFailedError) as info:
        HorovodRunner(np=2, launcher="direct", timeout=300).run(mpi_main)
    message = str(info.value)
    assert "ImportError: mpi4py.MPI is not available in this job" in message
    assert 'launcher="mpi"' in message
