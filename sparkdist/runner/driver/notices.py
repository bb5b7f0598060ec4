"""Decommission notices for a running job: Spark says an executor that hosts some of the
job's ranks is being decommissioned (`sparkdist/spark/decommission.py`), and the job
leaves it before the host goes, with nothing lost.

A watcher thread per attempt asks Spark every `POLL_S` about the executors of the
attempt's tasks (each task said its Spark task attempt id in its `TaskHello`) and acts
once per executor, as the job's kind allows:

* **in process** (every rank in `sparkdist.elastic.run`): the driver forms the next
  generation without the leaving ranks at once (`Membership.depart`, through the loop of
  attempts as a `WorldChange(leave=True)`); every rank stops at its next commit, the
  survivors go on from it with no rollback, the leaving ranks end cleanly;
* **relaunch path** (any other elastic job): as a pending grow does, rank 0's next
  `checkpoint.save` (at once with `save(..., every=N)`) stores the step and ends the
  attempt (`WorldResize`, not counted by max_failures); the next world is formed from the
  tasks Spark runs, none on the leaving executor;
* **fixed size**: nothing can leave a barrier stage; the driver says so, and what would.

A notice is no failure: if the host dies before the job has left it, that loss is handled
(and counted) as any loss.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sparkdist.runner.driver.job_state import JobState
from sparkdist.spark import Cluster
from sparkdist.spark.decommission import ClassicDecommissions, Notice, for_session

logger = logging.getLogger(__name__)

POLL_S = 0.5
"""How often the watcher asks Spark: a notice is acted on within about a second."""

Act = Callable[[Notice, list[int]], bool]
"""What the job's kind does with a notice for the executor of these launch ranks; False:
not yet (asked again at the next poll)."""


class NoticeWatcher:
    """Polls Spark for the decommission state of an attempt's executors (see the module)."""

    def __init__(self, source: ClassicDecommissions, state: JobState, act: Act):
        self.source, self.state, self.act = source, state, act
        self.seen: set[str] = set()
        """Executors acted on already."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sparkdist-notices", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self.poll()

    def poll(self) -> None:
        """Ask once; act on each executor newly seen leaving."""
        with self.state.cond:
            tasks = dict(self.state.tasks.spark_ids)
        leaving = self.source.leaving(tasks.values())
        per_task = self.state.job.ranks_per_task
        fresh: dict[str, tuple[Notice, list[int]]] = {}
        for index, task_id in sorted(tasks.items()):
            notice = leaving.get(task_id)
            if notice is None or notice.executor_id in self.seen:
                continue
            ranks = fresh.setdefault(notice.executor_id, (notice, []))[1]
            ranks.extend(
                r for r in range(index * per_task, (index + 1) * per_task) if r in self.state.ranks
            )
        for executor, (notice, ranks) in fresh.items():
            self.state.trace.instant("notice", {"why": notice.describe()}, ranks)
            try:
                if self.act(notice, ranks):
                    self.seen.add(executor)
            except Exception:  # noqa: BLE001 - a notice must never break the job
                self.seen.add(executor)
                logger.exception("acting on the decommission notice of %s", notice.describe())

    def stop(self) -> None:
        self._stop.set()


def watch(cluster: Cluster, state: JobState, act: Act) -> NoticeWatcher | None:
    """A watcher for the attempt whose state is `state`, if the session tells of
    decommissioning executors (a classic one does, see `spark/decommission.py`)."""
    source = for_session(cluster)
    return None if source is None else NoticeWatcher(source, state, act)


def fixed_size(np: int) -> Act:
    """A fixed-size job: say that the notice will end it, why, and what would not."""

    def act(notice: Notice, ranks: list[int]) -> bool:
        logger.warning(
            "sparkdist job: %s is being decommissioned (spot capacity taken back, a node "
            "drained): ranks %s run there, and this fixed-size job (np=%d) fails when the "
            "host goes, as a barrier stage cannot go on without it (max_failures relaunches "
            "it from its last checkpoint). An elastic job leaves such a host at the notice "
            "with nothing lost: HorovodRunner(min_np=..., max_np=%d) with "
            "checkpoint.save(state, step, every=N), or sparkdist.elastic.run",
            notice.describe(),
            ranks,
            np,
            np,
        )
        return True

    return act


def elastic(state: JobState) -> Act:
    """An elastic job: the leaving ranks go at the next commit (in process), or the
    world is relaunched without them from rank 0's next checkpoint."""

    def act(notice: Notice, ranks: list[int]) -> bool:
        reason = f"{notice.describe()} is being decommissioned (ranks {ranks})"
        membership = state.membership
        if membership.in_process():
            if not membership.depart(ranks, reason):
                logger.warning(
                    "sparkdist elastic job: %s; without them the world would be smaller "
                    "than min_np=%s, so it stays until the host goes (then a loss as any)",
                    reason,
                    membership.min_np,
                )
            return True
        entering = membership.min_np is not None and (
            membership.entered or not state.rank_records.all_started()
        )
        if entering:  # ranks may still enter elastic.run: in process once all have
            return False
        state.growth.request(reason, leave=True)
        logger.info(
            "sparkdist elastic job: %s: rank 0's next checkpoint.save stores its "
            "step, and the job relaunches without it",
            reason,
        )
        return True

    return act
