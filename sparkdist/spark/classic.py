"""A classic session as a `Cluster`: the SparkContext lives in this process, stages are
RDD jobs in a job group (`setJobGroup` is per thread), cancelled with `cancelJobGroup`."""

from __future__ import annotations

import time
from collections.abc import Iterator

from sparkdist import progress
from sparkdist.errors import NotEnoughSlotsError
from sparkdist.network import resolve
from sparkdist.spark.cluster import BarrierTask, PlainTask, ServicePlace
from sparkdist.spark.jobs import described
from sparkdist.spark.slots import (
    check_barrier_allowed,
    check_slot_bound,
    configured_slots,
    slots_needed,
)


class ClassicSpark:
    """A classic session (Databricks dedicated clusters, spark-submit, local Spark)."""

    kind = "classic"

    def __init__(self, sc):
        self.sc = sc

    def slots(self) -> int:
        # Right after start-up not every executor has registered: the configured count
        # keeps work from being sized for the few that have.
        configured = configured_slots(self.sc.master, self.sc.getConf().get)
        return configured or self.sc.defaultParallelism

    def _free_slots(self) -> int:
        jsc = self.sc._jsc.sc()
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))

    def check_slots(self, np: int, ranks_per_task: int, timeout_s: float) -> None:
        """Fail now, with both numbers, if the cluster cannot run the job's tasks at once.

        Executors may still be registering right after start-up, so wait for them up
        to `timeout_s` when the cluster could grow to enough slots.
        """
        conf = self.sc.getConf()
        check_barrier_allowed(conf.get)
        check_slot_bound(np, self.sc.master, conf.get, ranks_per_task)
        deadline = time.monotonic() + timeout_s
        needed = np // ranks_per_task
        slots = self._free_slots()
        if slots >= needed:
            return
        with progress.bar(needed, "sparkdist: waiting for task slots", unit="slots") as shown:
            while slots < needed:
                shown.set(slots)
                if time.monotonic() > deadline:
                    raise NotEnoughSlotsError(
                        f"{slots_needed(np, ranks_per_task)}, but the cluster has {slots} "
                        f"task slots (waited {timeout_s:.0f}s for executors). Lower np, or "
                        "add executors or cores."
                    )
                time.sleep(0.2)
                slots = self._free_slots()
            shown.set(slots)

    def check_elastic(self, max_np: int, ranks_per_task: int) -> None:
        check_slot_bound(max_np, self.sc.master, self.sc.getConf().get, ranks_per_task, "max_np")

    def service_place(self) -> ServicePlace:
        """The driver's own address, which every executor reaches."""
        conf = self.sc.getConf()
        advertise = resolve(conf.get("spark.driver.host", "127.0.0.1"))
        bind = conf.get("spark.driver.bindAddress", None) or advertise
        return ServicePlace(resolve(bind), advertise)

    def run_barrier_stage(
        self, num_tasks: int, task: BarrierTask, tag: str, description: str = "", announce=None
    ) -> list[bytes]:
        if announce is not None:
            raise ValueError("a classic session's executors reach its driver: nothing relays")
        with described(self.sc, description or f"sparkdist job {tag}", group=tag):
            rdd = self.sc.parallelize(range(num_tasks), num_tasks)
            return rdd.barrier().mapPartitions(task).collect()

    def run_tasks(
        self, num_tasks: int, task: PlainTask, tag: str, description: str = ""
    ) -> list[bytes]:
        def one(rows: Iterator[int]) -> Iterator[bytes]:
            for index in rows:
                yield task(index)

        with described(self.sc, description or f"sparkdist {tag}", group=tag):
            return self.sc.parallelize(range(num_tasks), num_tasks).mapPartitions(one).collect()

    def cancel(self, tag: str) -> None:
        self.sc.cancelJobGroup(tag)
