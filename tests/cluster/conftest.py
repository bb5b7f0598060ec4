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


@pytest.fixture(scope="session")
def host_driver(cluster, driver):
    """An application with at most one executor (one task slot) on each host, also
    after a host is lost, that takes decommission notices: an elastic job's ranks land on
    different hosts and a lost host's slot stays lost until a worker returns there
    (test_elastic_cluster.py, test_soak.py: one application for both saves a driver's
    start). It asks for the main driver first, so that the main application's executors
    are placed before this one's."""
    from netns_cluster import DECOMMISSION_CONF, HOST_RESOURCE_CONF
    from test_elastic_cluster import submit_conf, wait_executors

    with submit_conf({**HOST_RESOURCE_CONF, **DECOMMISSION_CONF}):
        remote = RemoteDriver(cluster, "elastic", cores=3)
    try:
        wait_executors(remote, 3)
        yield remote
    finally:
        remote.close()
