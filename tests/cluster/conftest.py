"""Fixtures of the multi-host tests: one namespaced Spark cluster for the whole test
session (built once, torn down at the end), and a driver process attached to it."""

from __future__ import annotations

import os

import pytest
from helpers import TEST_JVM_OPTIONS
from netns_cluster import PREFIX, SUBNET, NetnsCluster, can_build
from remote_driver import RemoteDriver


@pytest.fixture(scope="session")
def cluster():
    """Three hosts in network namespaces with a Spark master and a worker each."""
    reason = can_build()
    if reason:
        pytest.skip(f"no multi-host cluster here: {reason}")
    # 3 cores a host: two drivers (one core a host each) and a Spark Connect server's
    # application (test_connect_relay.py) at once.
    # Two test sessions on one machine each need their own names and addresses
    # (`up` removes whatever an earlier cluster of the same prefix left behind).
    built = NetnsCluster(
        hosts=3,
        worker_cores=3,
        prefix=os.environ.get("SPARKDIST_NETNS_PREFIX", PREFIX),
        subnet=os.environ.get("SPARKDIST_NETNS_SUBNET", SUBNET),
        daemon_java_options=TEST_JVM_OPTIONS,
    ).up()
    try:
        yield built
    finally:
        built.down()


@pytest.fixture(scope="session")
def driver(cluster):
    """The main driver process (an application with one executor on each host)."""
    remote = RemoteDriver(cluster, "main", cores=3)
    try:
        yield remote
    finally:
        remote.close()


@pytest.fixture(scope="session")
def second_driver(cluster):
    """A second application on the same cluster (another team's driver); the last
    test kills it."""
    remote = RemoteDriver(cluster, "second", cores=3)
    try:
        yield remote
    finally:
        remote.close()
