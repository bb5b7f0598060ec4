"""Which GPUs Spark gave a barrier task, or the driver (for np < 0): the addresses the
runner passes to the ranks (`job_environment.TASK_GPUS`), where the GPU backend turns
them into CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)


def gpu_addresses(resources: Mapping[str, Any] | None) -> list[str]:
    """The GPU addresses in a Spark resources map (`BarrierTaskContext.resources()`
    or `SparkContext.resources`); empty when there are none."""
    info = (resources or {}).get("gpu")
    return [str(a) for a in info.addresses] if info is not None else []


def driver_gpu_addresses() -> list[str]:
    """The GPUs Spark gave the driver (`spark.driver.resource.gpu.*`), if a
    SparkContext is active; else none. Never starts Spark."""
    try:
        from pyspark import SparkContext
    except ImportError:
        return []
    sc = SparkContext._active_spark_context
    if sc is None:
        return []
    try:
        return gpu_addresses(sc.resources)
    except Exception:  # noqa: BLE001 - a stopped or remote (Connect) context has none to give
        logger.debug("could not read the driver's GPU resources", exc_info=True)
        return []


def driver_resources(spark: Any) -> dict[str, Any]:
    """The driver's Spark resources, from the SparkContext or, on Spark Connect, the
    server, as pyspark's distributor finds them."""
    try:
        return spark.sparkContext.resources
    except Exception:  # noqa: BLE001 - a Connect session has no SparkContext
        return spark._client._resources()
