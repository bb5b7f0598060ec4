"""Which `api.LaunchKind` a job uses, chosen once per job from its options and, on
Spark, from where the Spark layer places the job's service."""

from __future__ import annotations

from sparkdist.runner.driver.launch.api import LaunchKind
from sparkdist.runner.driver.launch.barrier import BarrierKind
from sparkdist.runner.driver.launch.elastic import GangKind
from sparkdist.runner.driver.launch.local import DriverLocalKind
from sparkdist.runner.driver.launch.relayed import RelayedKind
from sparkdist.runner.driver.options import RunnerOptions
from sparkdist.spark import active_cluster


def choose_kind(options: RunnerOptions) -> LaunchKind:
    """np < 0: on the driver; min_np/max_np: a gang; else a barrier stage, relayed when
    the executors cannot reach this client."""
    if options.on_driver:
        return DriverLocalKind(options)
    cluster = active_cluster()
    if options.elastic:
        return GangKind(options, cluster)
    place = cluster.service_place()
    if place.in_stage:
        return RelayedKind(options, cluster, place)
    return BarrierKind(options, cluster, place)
