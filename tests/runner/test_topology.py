"""The host's topology file for orted (`runner/task/topology.py`): hwloc's export runs in
a child process, so that a crash there (it once aborted a whole pytest process that had
loaded torch and Open MPI) costs the caller nothing."""

import os
import subprocess
import sys
import time

from sparkdist.runner.task import topology


def test_the_hosts_topology_is_written_into_the_task_directory(tmp_path):
    # The process that crashed had torch and Open MPI's libraries loaded: so has this one.
    import horovod.torch  # noqa: F401  (loads libmpi and Horovod's own libraries)
    import mpi4py
    import torch  # noqa: F401

    mpi4py.rc.initialize = False  # Open MPI's library loaded, no MPI_Init (no orted)
    from mpi4py import MPI

    assert not MPI.Is_initialized()
    topology.host_topology_xml.cache_clear()
    env = topology.orted_topology_env(str(tmp_path), {})
    assert env == {"HWLOC_XMLFILE": str(tmp_path / "topology.xml"), "HWLOC_THISSYSTEM": "1"}, (
        "hwloc 2 (libhwloc.so.15) is installed beside Open MPI here"
    )
    xml = (tmp_path / "topology.xml").read_bytes()
    assert xml.startswith(b"<?xml") and b'type="Machine"' in xml
    assert b'type="PU"' in xml


def test_the_export_child_loads_neither_torch_nor_open_mpi():
    child = subprocess.run(
        [*topology._EXPORT_COMMAND[:1], "-X", "importtime", *topology._EXPORT_COMMAND[1:]],
        capture_output=True,
        check=True,
    )
    assert child.stdout.startswith(b"<?xml")
    imported = child.stderr.decode()
    for heavy in ("sparkdist", "torch", "mpi4py", "horovod", "pyspark", "numpy"):
        assert f" {heavy}" not in imported, heavy


def test_an_export_that_aborts_hangs_or_cannot_start_gives_no_file():
    aborts = [sys.executable, "-c", "import os; os.abort()"]
    assert topology.exported_by_child(aborts, timeout=30) is None
    started = time.monotonic()
    hangs = [sys.executable, "-c", "import time; time.sleep(300)"]
    assert topology.exported_by_child(hangs, timeout=1) is None
    assert time.monotonic() - started < 30
    assert topology.exported_by_child(["/nonexistent/python"], timeout=30) is None
    says_something_else = [sys.executable, "-c", "print('no hwloc here')"]
    assert topology.exported_by_child(says_something_else, timeout=30) is None


def test_a_topology_the_user_chose_is_left_alone(tmp_path):
    assert topology.orted_topology_env(str(tmp_path), {"HWLOC_XMLFILE": "/mine.xml"}) == {}
    assert not os.listdir(tmp_path)
