"""The gang kind, for an elastic job (`HorovodRunner(min_np=..., max_np=...)`): a world
that starts with the slots there are, shrinks when ranks are lost and grows when slots
free up.

Each attempt submits `max_np` ranks' worth of plain Spark tasks and lets the gang
(`gang.py`) seat the world from those that run: at least `min_np` ranks, as many as
arrive until none has for a moment, at most `max_np`. Then it is an ordinary job (the
same service, tasks, mpirun and ranks as a barrier job) with one more watcher: when
tasks have been standing by with free slots for `GROW_SETTLE_S`, rank 0's next
`sparkdist.checkpoint.save` stops it, and the job relaunches larger from that
checkpoint. A failure outside the training code (a lost executor, a killed rank)
relaunches it at once with the ranks the remaining slots hold; `max_failures` counts
those relaunches (no limit when it is not given: min_np and start_timeout bound them),
never growth. Every change is one line in the driver's log.

In process (every rank in `sparkdist.elastic.run`, the direct launcher; an elastic job
whose launcher is "auto" gets "direct"): a lost rank is dropped from the running world
(`membership.py`; counted by `max_failures` like a relaunch), and the tasks standing by
are seated into the running attempt as new tasks with fresh launch ranks
(`change_in_process`); the survivors keep their processes either way. A task whose every
rank the world went on without, while its executor lives, is told to end, so that its
slot goes back to Spark, and one more task is submitted in its place (`_SlotReturns`):
it checks in and stands by, and the world grows back into it. The task ends well, so
`spark.task.maxFailures` counts none of these.
"""

from __future__ import annotations

import functools
import logging
import threading
import time

from sparkdist.errors import SparkdistError
from sparkdist.network import join_address
from sparkdist.protocol import messages
from sparkdist.protocol.processes import ProcessRecord
from sparkdist.runner.driver import notices
from sparkdist.runner.driver.failures import Relaunch, RelaunchBudget, WorldChange
from sparkdist.runner.driver.job_spec import RunnerOptions
from sparkdist.runner.driver.job_state import JobState
from sparkdist.runner.driver.launch.api import AttemptPlan, World
from sparkdist.runner.driver.launch.barrier import wait_local_gone
from sparkdist.runner.driver.launch.gang import Gang
from sparkdist.runner.driver.records import send
from sparkdist.runner.driver.service import DriverService
from sparkdist.runner.task.spark_task import run_gang_task
from sparkdist.spark import Cluster, job_tag, spark_error_summary
from sparkdist.spark.decommission import for_session, setup_warning

logger = logging.getLogger(__name__)

GROW_SETTLE_S = 5.0
"""How long tasks must stand by with free slots before the job grows into them."""
_WARNED: set[str] = set()
"""The set-up warnings given already (`decommission.setup_warning`)."""
CANCEL_GRACE_S = 10.0
JOIN_TIMEOUT_S = 60.0


class GangKind:
    """An `api.LaunchKind`: every attempt a gang of `max_np` ranks' worth of plain
    tasks, the world seated from those that run (see the module's docstring)."""

    def __init__(self, options: RunnerOptions, cluster: Cluster):
        cluster.check_elastic(options.size_range[1], options.ranks_per_task)
        place = cluster.service_place()
        if place.in_stage:
            raise SparkdistError(
                "an elastic job (min_np/max_np) needs the executors to reach this Spark "
                "Connect client, which they cannot here: run it from a classic session or a "
                "client the cluster reaches, or drop min_np/max_np"
            )
        self.options = options
        self.cluster = cluster
        self.place = place
        self.state: JobState | None = None
        """The last world's state (None before the first)."""
        self.decommissions = for_session(cluster)
        warning = setup_warning(cluster, elastic=True)
        if warning and warning not in _WARNED:  # once per session, not every job
            _WARNED.add(warning)
            logger.warning("sparkdist elastic job: %s", warning)

    def form(self, plan: AttemptPlan, why: str) -> World:
        opts = self.options
        per_task = opts.ranks_per_task
        min_np, max_np = opts.size_range
        leaving = self.decommissions.is_leaving if self.decommissions else None
        gang = Gang(plan.secret, self.place.bind, self.place.advertise, leaving)
        # Every task gets the same spec; its seat gives it its index, the world's size and
        # the service's address.
        template = plan.spec(max_np, "")
        kind = f"elastic gang of {max_np // per_task} tasks for {min_np}..{max_np}"
        started = time.monotonic()
        tasks = _TaskJob(
            self.cluster,
            template,
            gang,
            max_np // per_task,
            job_tag(plan.job_id),
            plan.description(max_np, kind),
        )
        try:
            chosen = gang.form(
                min_np // per_task, max_np // per_task, opts.start_timeout, min_np, max_np
            )
        except BaseException:
            gang.close()
            tasks.stop()
            raise
        size = len(chosen) * per_task
        logger.warning("sparkdist elastic job: world %d -> %d ranks: %s", self._size(), size, why)
        in_process = min_np if plan.launcher == "direct" else None
        state = self.state = plan.new_state(size, in_process_min_np=in_process)
        tasks.state = state
        service = DriverService(state, plan.secret, self.place.bind, self.place.advertise)
        driver = join_address(*service.address)
        gang.closed_seat = functools.partial(_seat_closed, state)
        gang.seat(chosen, size, driver)
        watcher = _GrowWatcher(gang, state, max_np, per_task)
        watcher.notices = notices.watch(self.cluster, state, notices.elastic(state))
        auto = " (auto: direct for an elastic job)" if opts.launcher == "auto" else ""
        logger.info(
            "sparkdist job %s: %d ranks (elastic %d..%d), launcher %s%s",
            plan.job_id,
            size,
            min_np,
            max_np,
            plan.launcher,
            auto,
        )
        seated = _SeatedWorld(tasks, gang, state, watcher, driver, len(chosen))
        watcher.returns = _SlotReturns(state, tasks, seated)
        gang.room = functools.partial(_room, state, max_np, per_task)
        return World(state, service, seated, started)

    def _size(self) -> int:
        """The size of the last world (its last generation's): 0 before the first."""
        return 0 if self.state is None else len(self.state.membership.generation.members)

    def change_in_process(self, world: World, change: WorldChange) -> bool:
        """Shrink: the next generation, of the survivors (its log line is the
        membership's). Grow: seat the tasks standing by into the running attempt; the
        generation that includes them forms once each of their ranks entered."""
        state = world.state
        if change.leave:
            state.membership.let_leave()
            return True
        if not change.grow:
            state.membership.shrink()
            return True
        seated = world.launch
        assert isinstance(seated, _SeatedWorld)
        room = (self.options.size_range[1] - state.membership.size()) // self.options.ranks_per_task
        newcomers = seated.seat_more(room, change.reason)
        if newcomers:
            logger.info(
                "sparkdist elastic job: seated ranks %s into the running world: %s",
                newcomers,
                change.reason,
            )
        return bool(newcomers)

    def relaunching(
        self, job_id: str, relaunch: Relaunch, budget: RelaunchBudget, resume_point: str
    ) -> str:
        """The next world's log line says why (the world's size changes with it)."""
        why = f"{relaunch.reason}; resuming from {resume_point}"
        if not relaunch.counted:
            return why
        if budget.max_failures is None:
            return f"{why} (relaunch {budget.used}; no limit, as max_failures was not given)"
        return f"{why} (relaunch {budget.used} of at most {budget.max_failures})"


def _seat_closed(state: JobState, index: int, host: str) -> None:
    """A seated task closed its check-in connection: one that never reached the job's
    service was lost as it was seated (its executor died), and is lost like any other
    task (the world goes on or relaunches without it), not awaited until start_timeout."""
    with state.cond:
        reached = index in state.tasks.started or index in state.tasks.lost
    if reached or state.failures.stopping is not None or state.failures.failed:
        return
    logger.info("sparkdist elastic job: task %d on host %s was lost as it was seated", index, host)
    state.losses.task_lost(index, host)


def _room(state: JobState, max_np: int, per_task: int) -> int:
    """How many more tasks the world can take: `max_np` less its members (but those lost,
    whose tasks are replaced) and newcomers, in tasks."""
    membership = state.membership
    with state.cond:
        taken = len(membership.survivors()) + len(membership.joining)
    return max(0, max_np - taken) // per_task


class _TaskJob:
    """The attempt's Spark jobs of plain tasks, each run from a thread: the first of
    `max` tasks, and one more for each task that gave its slot back (`add`)."""

    def __init__(
        self, cluster: Cluster, template, gang: Gang, num_tasks: int, tag: str, description: str
    ):
        self.description = description
        self.cluster = cluster
        self.tag = tag
        self.state: JobState | None = None
        self.cancelled = False
        self.gang = gang
        self._task = functools.partial(run_gang_task, template, gang.address)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.add(num_tasks)

    def add(self, num_tasks: int) -> None:
        """Submit `num_tasks` more tasks, in a Spark job of their own with the same tag
        (so that `stop` cancels it too); none once stopped."""
        with self._lock:
            if self.cancelled:
                return
            thread = threading.Thread(
                target=self._run, args=(num_tasks,), name=self.tag, daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _run(self, num_tasks: int) -> None:
        try:
            self.cluster.run_tasks(num_tasks, self._task, self.tag, self.description)
        except BaseException as exc:  # noqa: BLE001 - reported through the job's state
            if self.cancelled:
                logger.debug("elastic tasks %s ended: %s", self.tag, spark_error_summary(exc))
                return
            if self.state is None:  # the world has not formed yet
                self.gang.fail(
                    f"the Spark job of the elastic tasks failed: {spark_error_summary(exc)}"
                )
                return
            self.state.losses.fail(
                f"the Spark job of the elastic tasks failed: {spark_error_summary(exc)}"
            )

    def stop(self) -> None:
        with self._lock:
            self.cancelled = True
            running = [t for t in self._threads if t.is_alive()]
        if running:
            logger.info("cancelling the elastic tasks %s", self.tag)
            self.cluster.cancel(self.tag)
            deadline = time.monotonic() + JOIN_TIMEOUT_S
            for thread in running:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))


class _GrowWatcher:
    """Asks the world to grow once tasks have stood by for GROW_SETTLE_S (again after
    each grow in process, while there is room up to max_np)."""

    def __init__(self, gang: Gang, state: JobState, max_np: int, per_task: int):
        self.gang, self.state = gang, state
        self.max_np, self.per_task = max_np, per_task
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sparkdist-grow", daemon=True)
        self.notices: notices.NoticeWatcher | None = None
        """The attempt's decommission notices (stopped with it)."""
        self.returns: _SlotReturns | None = None
        """Gives the slots of tasks whose ranks are all gone back to Spark, each tick."""

    def start(self) -> None:
        """Watch while the world is below max_np, or may fall below it (in process, also
        below min_np: its slots come back, `_SlotReturns`, and it grows into them)."""
        low = self.state.job.in_process_min_np
        if self.state.membership.size() < self.max_np or low is not None:
            self._thread.start()

    def _run(self) -> None:
        growth, since = self.state.growth, None
        while not self._stop.wait(0.5):
            if growth.resizing is not None:
                return  # rank 0 stops at its checkpoint: the job relaunches larger
            if self.returns is not None:
                self.returns.check()
            room = self.max_np - self.state.membership.size()
            extra = min(self.gang.standing_by() * self.per_task, room)
            if extra <= 0 or growth.reason is not None:  # nothing to grow into, or asked
                since = None
                continue
            since = since or time.monotonic()
            waits = self.state.membership.wait is not None  # below min_np: grow at once
            if waits or time.monotonic() - since >= GROW_SETTLE_S:
                settled = "below min_np" if waits else f"for {GROW_SETTLE_S:.0f}s"
                growth.request(f"{extra} more rank slot(s) free {settled} (max_np={self.max_np})")
                since = None

    def stop(self) -> None:
        self._stop.set()
        if self.notices is not None:
            self.notices.stop()


class _SlotReturns:
    """Gives back to Spark the slot of each seated task whose every rank an in-process
    world went on without (killed, exited, dropped as silent, left), while the task and
    its executor live: the task is told to finish (it stops what is left of its ranks and
    ends well, so no task failure is counted), and one more task is submitted in its
    place, which checks in with the gang and stands by for the world to grow into. A task
    whose executor was lost (its channel to the driver broke) gets one submitted in its
    place too: Spark runs it again only when its executor died, not when the task ended
    well after the driver lost it (a host cut off for longer than the dead-peer
    detection); a task beyond the world's room is released at check-in (`Gang.room`)."""

    def __init__(self, state: JobState, tasks: _TaskJob, seated: _SeatedWorld):
        self.state, self.tasks, self.seated = state, tasks, seated
        self.released: set[int] = set()

    def check(self) -> None:
        """Release the tasks whose ranks are all gone, and submit as many in their place."""
        state = self.state
        if state.job.in_process_min_np is None:
            return
        per_task = state.job.ranks_per_task
        released: list[tuple[int, list[int]]] = []
        lost: list[int] = []
        with state.cond:
            for index in range(self.seated.num_tasks):
                ranks = list(range(index * per_task, (index + 1) * per_task))
                if index in self.released or not all(map(self._gone, ranks)):
                    continue
                self.released.add(index)
                if index in state.tasks.lost:
                    lost.append(index)
                elif state.peers.channel("task", index):
                    released.append((index, ranks))
                else:
                    self.released.discard(index)  # ended or not connected yet: look again
        if lost:
            logger.info(
                "sparkdist elastic job: tasks %s were lost: as many new tasks are submitted "
                "to take their place",
                lost,
            )
        for index, ranks in released:
            logger.info(
                "sparkdist elastic job: task %d's ranks %s left the world: its slot goes "
                "back to Spark, and a new task is submitted to take it",
                index,
                ranks,
            )
            channel = state.peers.channel("task", index)
            send([channel] if channel else [], messages.Finish(f"its ranks {ranks} left"))
        if released or lost:
            self.tasks.add(len(released) + len(lost))

    def _gone(self, rank: int) -> bool:
        """The world went on without `rank`, and its process ended (or its supervisor,
        which the task's end then stops for good)."""
        state = self.state
        if rank not in state.membership.left:
            return False
        record = state.ranks.get(rank)
        return record is None or record.exited or not state.peers.channel("supervisor", rank)


class _SeatedWorld:
    """A `launch.Launch` for a seated world: its tasks already run; stopping it lets them
    end, releases the tasks standing by, and cancels the ones Spark has not started."""

    def __init__(
        self,
        tasks: _TaskJob,
        gang: Gang,
        state: JobState,
        watcher: _GrowWatcher,
        driver: str,
        num_tasks: int,
    ):
        self.tasks, self.gang, self.state, self.watcher = tasks, gang, state, watcher
        self.driver = driver
        self.num_tasks = num_tasks
        """Tasks seated so far: the next one seated gets this index."""

    def seat_more(self, most: int, reason: str) -> list[int]:
        """Seat up to `most` tasks standing by as the next tasks of the running world;
        return the launch ranks they run (each task's, after every rank used before)."""
        per_task = self.state.job.ranks_per_task
        ranks: list[int] = []

        def records(indexes: list[int]) -> None:  # before the tasks hear of their seats
            ranks.extend(i * per_task + r for i in indexes for r in range(per_task))
            self.state.add_ranks(ranks, reason)

        seated = self.gang.seat_standing(most, self.num_tasks, per_task, self.driver, records)
        self.num_tasks += seated
        return ranks

    def start(self) -> None:
        self.watcher.start()

    def wait(self, start_deadline: float, deadline: float | None, launcher_expected: bool) -> None:
        self.state.failures.wait(start_deadline, deadline, launcher_expected)

    def stop(self, finished: bool) -> list[ProcessRecord]:
        self.watcher.stop()
        self.state.tasks.wait_done(self.state.tasks.live_count(), CANCEL_GRACE_S)
        self.gang.close()
        self.tasks.stop()
        return wait_local_gone(self.state)
