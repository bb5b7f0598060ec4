"""The host's hardware topology, read once per executor process and handed to orted as a file.

Every orted reads the machine's topology with hwloc when it starts, twice (Open MPI's
own read, which `hwloc_base_topo_file` replaces, and a second one that only
`HWLOC_XMLFILE` reaches), and on a virtual machine that is most of its cost:
reading each PCI device's configuration space traps to the hypervisor. At np=32 on one
2-core VM a third of all of orted's CPU went there (perf). hwloc loads a topology from
an XML file instead when `HWLOC_XMLFILE` names one (`HWLOC_THISSYSTEM=1`: it is this
machine's, so binding still works). A Spark Python worker is reused from job to job, so
the export happens once per worker; each mpi job's task writes it into its own directory
for its orted.

The export (hwloc's own, through ctypes) runs in a child process, this file run as
`python -S -I topology.py` (stdlib only, as mpirun's rsh agent: about 40 ms of CPU). In a
process that had loaded torch and Open MPI's libraries it once aborted the whole process
inside `hwloc_topology_export_xmlbuffer` (two hwloc copies in one process), and an
executor's Python worker must not die for an optimisation. Without hwloc 2 (`libhwloc.so`),
or if the child fails, crashes or hangs, nothing changes: orted reads the hardware itself,
as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence

logger = logging.getLogger(__name__)

XML_FILE = "HWLOC_XMLFILE"
THIS_SYSTEM = "HWLOC_THISSYSTEM"
_EXPORT_COMMAND = (sys.executable, "-S", "-I", os.path.abspath(__file__))
_EXPORT_TIMEOUT = 10.0
"""Seconds the child may take (it needs about 0.1 s; a hung one must not hold a job)."""
_KEEP_IMPORTANT = 3
"""HWLOC_TYPE_FILTER_KEEP_IMPORTANT: the I/O objects Open MPI asks hwloc to keep."""
_EXPORT_V1 = 1
"""HWLOC_TOPOLOGY_EXPORT_XML_FLAG_V1: a file that hwloc 1.11 reads as well as 2.x."""
_BLACKLIST = 1
"""HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST (hwloc 2.1+)."""
_GPU_COMPONENTS = (b"cuda", b"nvml", b"rsmi", b"levelzero", b"opencl", b"gl")
"""hwloc's GPU plugins, left out: the executor process lives on, and they would start
GPU runtimes in it (Open MPI's TCP transport does not use GPU objects)."""


@functools.cache
def host_topology_xml() -> bytes | None:
    """This machine's topology as hwloc XML, read once per process (in a child process);
    None without hwloc 2 or if the child fails."""
    return exported_by_child(_EXPORT_COMMAND, _EXPORT_TIMEOUT)


def exported_by_child(command: Sequence[str], timeout: float) -> bytes | None:
    """The XML that `command` writes to its stdout; None (logged at debug) if it cannot
    start, exits non-zero, is killed by a signal, takes longer than `timeout` seconds or
    writes something else."""
    try:
        child = subprocess.run(
            command, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.debug("no hwloc topology file for orted: %s", exc)
        return None
    if child.returncode != 0 or not child.stdout.startswith(b"<?xml"):
        stderr = child.stderr.decode(errors="replace").strip()[-500:]
        logger.debug(
            "no hwloc topology file for orted: the export exited %s: %s", child.returncode, stderr
        )
        return None
    return child.stdout


def _export_here() -> bytes | None:
    """The export itself, in this process: only the child (`main`) calls it."""
    hwloc = _load_hwloc()
    if hwloc is None or hwloc.hwloc_get_api_version() < 0x20000:
        return None
    return _export(hwloc)


def _load_hwloc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libhwloc.so.15")  # hwloc 2.x, without find_library's ldconfig
    except OSError:
        name = ctypes.util.find_library("hwloc")
        return ctypes.CDLL(name) if name else None


def _export(hwloc: ctypes.CDLL) -> bytes | None:
    topology = ctypes.c_void_p()
    if hwloc.hwloc_topology_init(ctypes.byref(topology)) != 0:
        return None
    try:
        hwloc.hwloc_topology_set_io_types_filter(topology, _KEEP_IMPORTANT)
        set_components = getattr(hwloc, "hwloc_topology_set_components", None)
        for name in _GPU_COMPONENTS if set_components is not None else ():
            set_components(topology, ctypes.c_ulong(_BLACKLIST), name)
        if hwloc.hwloc_topology_load(topology) != 0:
            return None
        buffer, size = ctypes.c_void_p(), ctypes.c_int()
        flags = ctypes.c_ulong(_EXPORT_V1)
        if hwloc.hwloc_topology_export_xmlbuffer(
            topology, ctypes.byref(buffer), ctypes.byref(size), flags
        ):
            return None
        try:
            return ctypes.string_at(buffer, size.value).rstrip(b"\0")
        finally:
            hwloc.hwloc_free_xmlbuffer(topology, buffer)
    finally:
        hwloc.hwloc_topology_destroy(topology)


def orted_topology_env(directory: str, env: Mapping[str, str]) -> dict[str, str]:
    """The variables that point orted's hwloc at this host's topology, written into
    `directory` (the task's own); nothing if the user chose a topology or hwloc is absent."""
    if XML_FILE in env:
        return {}
    xml = host_topology_xml()
    if xml is None:
        return {}
    path = os.path.join(directory, "topology.xml")
    with open(path, "wb") as f:
        f.write(xml)
    return {XML_FILE: path, THIS_SYSTEM: "1"}


def main() -> int:
    """The child: the topology's XML on stdout, exit status 1 without hwloc 2."""
    xml = _export_here()
    if xml is None:
        return 1
    sys.stdout.buffer.write(xml)
    return 0


if __name__ == "__main__":
    sys.exit(main())
