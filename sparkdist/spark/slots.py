"""How many task slots a cluster has: from its configuration (works on every kind of
session) and, on a classic session, from the scheduler itself."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from sparkdist.errors import NotEnoughSlotsError, SparkdistError


def slots_upper_bound(master: str, task_cpus: int) -> int | None:
    """The most task slots a fixed-size master can ever offer; None if unknown."""
    if master == "local":
        return 1
    match = re.fullmatch(r"local\[(\*|\d+)(?:,\s*\d+)?\]", master)
    if match:
        cores = (os.cpu_count() or 1) if match.group(1) == "*" else int(match.group(1))
        return max(cores // task_cpus, 0)
    match = re.fullmatch(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]", master)
    if match:
        return int(match.group(1)) * (int(match.group(2)) // task_cpus)
    return None


def configured_slots(master: str, conf_get: Callable[..., str | None]) -> int | None:
    """The task slots a fixed-size cluster has once all its executors registered, from
    its configuration alone (right after start-up fewer may have registered); None when
    unknown or when dynamic allocation can grow it."""
    task_cpus = int(conf_get("spark.task.cpus", None) or "1")
    if dynamic_allocation(conf_get):
        return None
    bound = slots_upper_bound(master, task_cpus)
    if bound is None:
        instances = conf_get("spark.executor.instances", None)
        cores = conf_get("spark.executor.cores", None)
        if instances and cores:
            bound = int(instances) * (int(cores) // task_cpus)
    return bound


def session_slots(spark: Any) -> int | None:
    """The task slots of a session's cluster: its configuration's count (works under
    Spark Connect too), else a classic session's default parallelism; None if unknown."""
    conf_get = spark.conf.get
    slots = configured_slots(conf_get("spark.master", None) or "", conf_get)
    if slots is None and hasattr(spark, "_jsc"):
        slots = spark.sparkContext.defaultParallelism
    return slots


def slots_needed(np: int, ranks_per_task: int = 1, name: str = "np") -> str:
    """How a slot error states the need, e.g. "np=4 ranks (2 per task) need 2 task slots"."""
    per_task = f" ({ranks_per_task} per task)" if ranks_per_task > 1 else ""
    return f"{name}={np} ranks{per_task} need {np // ranks_per_task} task slots at once"


def dynamic_allocation(conf_get: Callable[..., str | None]) -> bool:
    return (conf_get("spark.dynamicAllocation.enabled", None) or "false").lower() == "true"


def check_barrier_allowed(conf_get: Callable[..., str | None]) -> None:
    """Spark refuses barrier stages under dynamic allocation (SPARK-24942): say so, and
    what to do, before any Spark job rather than with Spark's own exception."""
    if dynamic_allocation(conf_get):
        raise SparkdistError(
            "this Spark has dynamic allocation on (spark.dynamicAllocation.enabled=true), "
            "where Spark refuses the barrier stage a fixed-size job needs (SPARK-24942). "
            "Make the job elastic with min_np=/max_np= (its ranks run as plain tasks), or "
            "turn dynamic allocation off."
        )


def check_slot_bound(
    np: int,
    master: str,
    conf_get: Callable[..., str | None],
    ranks_per_task: int = 1,
    name: str = "np",
) -> None:
    """Raise `NotEnoughSlotsError` when a fixed-size cluster can never run the job's
    tasks at once (reading only configuration, so it works on any kind of session)."""
    bound = configured_slots(master, conf_get)
    if bound is not None and np // ranks_per_task > bound:
        raise NotEnoughSlotsError(
            f"{slots_needed(np, ranks_per_task, name)}, but this Spark ({master}, "
            f"spark.task.cpus={conf_get('spark.task.cpus', None) or '1'}) has {bound} task "
            f"slots. Lower {name}, or give the cluster more executors or cores."
        )
