"""The host's hardware topology, read once per executor process and handed to orted as a file.

Every orted reads the machine's topology with hwloc when it starts, twice (Open MPI's
own read, which `hwloc_base_topo_file` replaces, and a second one that only
`HWLOC_XMLFILE` reaches), and on a virtual machine that is most of its cost:
reading each PCI device's configuration space traps to the hypervisor. At np=32 on one
2-core VM a third of all of orted's CPU went there (perf). hwloc loads a topology from
an XML file instead when `HWLOC_XMLFILE` names one (`HWLOC_THISSYSTEM=1`: it is this
machine's, so binding still works). A Spark Python worker is reused from job to job, so
the export (hwloc's own, through ctypes) happens once per worker; each mpi job's task
writes it into its own directory for its orted.

Without hwloc 2 (`libhwloc.so`), or if hwloc fails, nothing changes: orted reads the
hardware itself, as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
from collections.abc import Mapping

logger = logging.getLogger(__name__)

XML_FILE = "HWLOC_XMLFILE"
THIS_SYSTEM = "HWLOC_THISSYSTEM"
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
    """This machine's topology as hwloc XML, read once per process; None without hwloc 2."""
    try:
        hwloc = _load_hwloc()
        if hwloc is None:
            return None
        if hwloc.hwloc_get_api_version() < 0x20000:
            return None
        return _export(hwloc)
    except (OSError, AttributeError) as exc:
        logger.debug("no hwloc topology file for orted: %s", exc)
        return None


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
