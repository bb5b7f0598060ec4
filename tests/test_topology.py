"""The host's topology file for orted (`runner/task/topology.py`)."""

import os

import pytest

from sparkdist.runner.task import topology


def test_the_hosts_topology_is_written_into_the_task_directory(tmp_path):
    if topology.host_topology_xml() is None:
        pytest.fail("hwloc 2 (libhwloc.so.15) is installed beside Open MPI here")
    env = topology.orted_topology_env(str(tmp_path), {})
    assert env == {"HWLOC_XMLFILE": str(tmp_path / "topology.xml"), "HWLOC_THISSYSTEM": "1"}
    xml = (tmp_path / "topology.xml").read_bytes()
    assert xml.startswith(b"<?xml") and b'type="Machine"' in xml
    assert b'type="PU"' in xml


def test_a_topology_the_user_chose_is_left_alone(tmp_path):
    assert topology.orted_topology_env(str(tmp_path), {"HWLOC_XMLFILE": "/mine.xml"}) == {}
    assert not os.listdir(tmp_path)
