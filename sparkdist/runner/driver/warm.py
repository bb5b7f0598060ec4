"""Warm worlds (`HorovodRunner(keep_warm=S)`): ranks kept between runs, so that the next
run of the same shape starts in the processes of the last, with their imports, models
and process state, instead of paying the whole start-up again.

A warm world is one job, run from a driver thread by the ordinary loop (`job.run_job`),
whose `main` is the ranks' run loop (`runner/rank/warm.py`). Each user run is handed to
its idle ranks through the job's service (`WarmDispatch`, answered on the service's
loop): a fresh job id, the payload signed with that run's own key, and the run is done
when every rank said so. The world's processes, Spark tasks and slots stay between runs.

A world is released (its ranks return, its job ends, its slots come back) when it has
been idle `keep_warm` seconds, when the runner is closed, when a run of another shape
comes (one line in the log says so), or when the driver process exits. A run that fails
ends its world with it, as a job's failure does: the next run starts a new one. One
world is kept per driver process (`current`), whichever runner made it, so that a
notebook cell that builds a new runner of the same shape finds the last cell's ranks.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import os
import tempfile
import threading
import time
import uuid
from typing import Any

import cloudpickle

from sparkdist import job_environment, tracking
from sparkdist.checkpoint.driver.store import CheckpointStore
from sparkdist.errors import JobTimeoutError, SparkdistError
from sparkdist.protocol import messages, payload
from sparkdist.runner.driver.job_spec import JobReport, Outcome, RunnerOptions
from sparkdist.runner.driver.stalls import StallWatch
from sparkdist.runner.rank import warm as rank_loop

logger = logging.getLogger(__name__)

PER_RUN = (
    "start_timeout",
    "timeout",
    "stall_warning",
    "stall_timeout",
    "max_failures",
    "retry_on_exception",
    "checkpoint_keep",
    "report_ranks",
    "timeline",
    "trace",
    "keep_warm",
)
"""Options a run may change on a warm world; every other one is the world's shape."""


def shape(options: RunnerOptions) -> dict[str, Any]:
    """What a warm world must have in common with a run to take it: np, ranks per task,
    launcher, environment, where the ranks run..."""
    fields = dataclasses.fields(options)
    return {
        **{f.name: getattr(options, f.name) for f in fields if f.name not in PER_RUN},
        "launcher": options.resolved_launcher(),
    }


class WarmDispatch:
    """The world's side of its ranks' run loop, kept by the job's state (`state.warm`):
    idle ranks wait here for the next run (`next`, on the service's loop), each says
    when it finished one (`done`), and the driver's run waits for all of them (`wait`)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.state = None
        """The world job's `JobState`, once formed (a relaunched attempt's, after one)."""
        self.secret = None
        self.attempt = 0
        """The world job's attempt now: an elastic world relaunches when it loses ranks."""
        self.world_store = None  # the state's between runs: a run's own store is closed
        self.handed: HandedRun | None = None
        """The last run handed out."""
        self.waiting: dict[int, Any] = {}
        self.finished: dict[int, messages.WarmDone] = {}
        self.released: str | None = None
        self.ended: BaseException | None = None
        self.over = False
        """The world job ended (`ended`: its error, if it failed)."""
        self.payload_bytes_sent = 0
        """Bytes of run payloads the service sent (once per task's relay and run)."""
        self.relayed = False
        """Served from barrier task 0 (Spark Connect relay mode): the client's runs are
        carried there by Spark tasks, to `address`, where `carry` runs them."""
        self.address: str | None = None
        self.carried = 0
        """The client's count of the runs it carried to a relayed world."""
        self.carry = None
        """Task 0's: runs a carried `messages.WarmCarry` (`relayed.HostedJob.carry`)."""
        self._idle: threading.Timer | None = None

    def attach(self, state, secret, attempt: int = 0) -> None:
        """The world job formed an attempt's state (`launch.api.AttemptPlan.new_state`).
        A relaunched attempt of an elastic world (a loss, or growth) takes the run in
        progress: its ranks start it again, from the run's last checkpoint, with the
        run's payload signed by the new attempt's key."""
        with self.cond:
            self.state, self.secret, self.attempt = state, secret, attempt
            self.finished, self.waiting = {}, {}  # the last attempt's ranks are gone
            self.world_store = state.checkpoints
            handed = self.handed
            if handed is not None and not handed.complete:
                handed.sign(secret, attempt)
                if handed.store is not None:
                    state.checkpoints = handed.store
            self.cond.notify_all()

    def hosted_at(self, address: str) -> None:
        """A relayed world's task 0 serves it at `address` (its stage announced it)."""
        with self.cond:
            self.address = address
            self.cond.notify_all()

    def wait_ready(self) -> None:
        """Until the world can take a run (its state formed; a relayed one's address
        known); raises why not if it ended first."""
        with self.cond:
            while self.secret is None or (self.relayed and self.address is None):
                if self.over:
                    raise self.gone()
                self.cond.wait(0.2)

    def next(self, rank: int, after: int, reply) -> None:
        """Rank `rank` is idle after run `after`: answer it with the next run, now or
        when it comes, or with the release."""
        with self.cond:
            if self.released is not None:
                reply(messages.WarmRelease(self.released))
            elif (h := self.handed) and h.order.run > after and not h.complete:  # not done
                self.state.membership.took_run(rank)
                reply(h.for_rank(rank, self.state.membership.generation))
            else:
                self.waiting[rank] = reply

    def done(self, rank: int, report: messages.WarmDone) -> None:
        with self.cond:
            if self.handed is not None and report.run == self.handed.order.run:
                self.finished[rank] = report
                self.cond.notify_all()

    @property
    def runs(self) -> int:
        """How many runs were handed out (the last one's number)."""
        if self.relayed:
            return self.carried
        return 0 if self.handed is None else self.handed.order.run

    def submit(
        self, job_id: str, blob: bytes, all_results: bool, env, rank0_env, store=None
    ) -> None:
        """Hand the idle ranks a new run (`env` for every rank, `rank0_env` for rank 0
        alone; `store`: the run's checkpoint store)."""
        self.wait_ready()
        with self.cond:
            if self.over:
                raise self.gone()
            order = messages.WarmRun(self.runs + 1, job_id, blob, b"", all_results, env)
            self.handed = HandedRun(order, rank0_env, store, self.attempt)
            self.handed.sign(self.secret, self.attempt)
            if store is not None:
                self.state.checkpoints = store
            self.state.membership.new_run()  # its code says again whether it is elastic
            self.finished = {}
            waiting, self.waiting = self.waiting, {}
            generation = self.state.membership.generation
            for rank, reply in waiting.items():
                self.state.membership.took_run(rank)
                reply(self.handed.for_rank(rank, generation))

    def run(
        self,
        job_id,
        blob,
        all_results,
        env,
        rank0_env,
        deadline,
        limits,
        announce,
        join_world,
        store=None,
    ) -> list[messages.WarmDone]:
        """Hand out a run and wait for its end (every rank's report), watching it for
        stalls (`limits`: its `stall_warning` and `stall_timeout`, said by `announce`).
        Past `deadline`, or interrupted, the world ends (its job says where each rank
        was); then, and when the world failed, this raises the world's error once
        `join_world()` saw its job end."""
        self.submit(job_id, blob, all_results, env, rank0_env, store)
        for rank in self._members():
            self.state.life.seen(rank)  # idle time before the run is no stall
        # The watch follows the world's state: a relaunch mid-run goes on in new ranks.
        with StallWatch(self.state, limits, job_id, announce, follow=lambda: self.state):
            try:
                return self.wait(deadline)
            except JobTimeoutError as exc:
                self.state.failures.fail_now(exc)
            except KeyboardInterrupt:
                self.state.failures.fail_now(KeyboardInterrupt())
                join_world()
                raise
            join_world()
        raise self.gone()

    def arm_idle(self, seconds: float, expire) -> None:
        """Call `expire(runs)` after `seconds` without a run (`runs`: the count when
        armed, so that it can tell whether a run came meanwhile)."""
        self.cancel_idle()
        self._idle = threading.Timer(seconds, expire, args=(self.runs,))
        self._idle.daemon = True
        self._idle.start()

    def cancel_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def wait(self, deadline: float | None) -> list[messages.WarmDone]:
        """Until every rank finished the run (their reports, in rank order); raises the
        world's error if it ended first, `JobTimeoutError` at `deadline`."""
        with self.cond:
            while running := sorted(set(self._members()) - set(self.finished)):
                if self.over:
                    raise self.gone()
                if deadline is not None and time.monotonic() > deadline:
                    raise JobTimeoutError(
                        f"timeout: ranks {running} were still running when the run's time "
                        "limit ran out; the warm world was stopped."
                    )
                self.cond.wait(0.2)
            self.handed.complete = True
            self.state.membership.end_run()  # newcomers too late for it leave it
            self.state.checkpoints = self.world_store
            return [self.finished[r] for r in self._members()]

    def _members(self) -> tuple[int, ...]:
        """The launch ranks the run waits for, in world-rank order: every rank of the
        attempt, unless an in-process elastic world re-formed without some or with
        newcomers (its current generation's members; its world rank 0's result first)."""
        return self.state.membership.generation.members

    def release(self, reason: str) -> None:
        with self.cond:
            if self.released is None:
                self.released = reason
            waiting, self.waiting = self.waiting, {}
        for reply in waiting.values():
            reply(messages.WarmRelease(reason))

    def world_ended(self, error: BaseException | None) -> None:
        with self.cond:
            self.over, self.ended = True, error
            self.cond.notify_all()

    def gone(self) -> BaseException:
        """What a run on the ended world raises: its job's error, or why it was released."""
        if self.ended is not None:
            return self.ended
        return SparkdistError(f"the warm world ended ({self.released or 'its job ended'})")


class HandedRun:
    """A run handed to a warm world's ranks: its order, signed with the key of the
    world's attempt now (an elastic world that relaunched mid-run hands it again to its
    new ranks), what rank 0 alone gets, its own checkpoint store, and whether every rank
    finished it (ranks seated after that wait for the next run)."""

    def __init__(self, order: messages.WarmRun, rank0_env, store, attempt: int):
        self.order, self.rank0_env, self.store = order, rank0_env, store
        self.first_attempt = attempt
        self.complete = False

    def sign(self, secret, attempt: int) -> None:
        """Sign the order with `secret`, the key of the world's attempt `attempt`; the
        run's ranks see that attempt as the run's relaunches (`checkpoint.attempt()`)."""
        order = self.order
        relaunches = {job_environment.ATTEMPT: str(attempt - self.first_attempt)}
        self.order = order._replace(
            signature=secret.run_tag(order.job_id, order.payload),
            env=messages.SecretEnv({**order.env, **relaunches}),
        )

    def for_rank(self, rank: int, generation: messages.Generation) -> messages.WarmRun:
        """The order as launch rank `rank` gets it. After an in-process elastic world
        re-formed, a run's ranks are its generation's members: `RANK` and `WORLD_SIZE`
        say so (the backends meet over them before `main`), and its world rank 0
        returns the result."""
        order, members = self.order, generation.members
        first = rank == members[0]
        env = {**order.env, **self.rank0_env} if first else dict(order.env)
        if generation.number > 0 and rank in members:
            env.update(RANK=str(members.index(rank)), WORLD_SIZE=str(len(members)))
        send = order.send_result or first
        return order._replace(send_result=send, env=messages.SecretEnv(env))


class WarmWorld:
    """One warm world: its job's thread, its dispatch, and its idle timer."""

    def __init__(self, options: RunnerOptions):
        self.options = options
        self.shape = shape(options)
        self.keep_warm = float(options.keep_warm)
        self.dispatch = WarmDispatch()
        self.report = JobReport(
            job_id="", np=options.np, launcher=options.resolved_launcher(), name="warm world"
        )
        self.started = time.monotonic()
        self.idle_since = self.started
        self._run_lock = threading.Lock()
        # A fixed-size world ends at its first loss; an elastic one relaunches within
        # its first run's max_failures, counted over the world's life.
        failures = options.max_failures if options.elastic else 0
        world_options = dataclasses.replace(
            options, timeout=None, stall_warning=None, stall_timeout=None, max_failures=failures
        )
        self._thread = threading.Thread(
            target=self._serve, args=(world_options,), name="sparkdist-warm-world", daemon=True
        )

    def start(self) -> None:
        self.listing = _list(self)
        self._thread.start()

    def entry(self) -> dict[str, Any]:
        """What `sparkdist doctor` shows of this world, from any process of the machine."""
        return {
            "pid": os.getpid(),
            "np": self.options.np,
            "launcher": self.report.launcher,
            "keep_warm": self.keep_warm,
            "since": time.time() - (time.monotonic() - self.started),
        }

    def _serve(self, options: RunnerOptions) -> None:
        from sparkdist.runner.driver.job import run_job

        error: BaseException | None = None
        try:
            blob = payload.pack(rank_loop.serve, {})
            run_job(options, blob, False, self.report, warm=self.dispatch)
        except BaseException as exc:  # noqa: BLE001 - the run waiting on it raises it
            error = exc
        finally:
            self.dispatch.world_ended(error)
            _unlist(getattr(self, "listing", None))

    @property
    def usable(self) -> bool:
        d = self.dispatch
        return not d.over and d.released is None

    def describe(self) -> str:
        """One line for `sparkdist doctor` and the log."""
        idle = time.monotonic() - self.idle_since
        return (
            f"warm world of job {self.report.job_id or '(starting)'}: np={self.options.np}, "
            f"launcher {self.report.launcher}, {self.dispatch.runs} runs, idle {idle:.0f}s of "
            f"keep_warm={self.keep_warm:g}s"
        )

    def run(
        self, options: RunnerOptions, blob: bytes, all_results: bool, report: JobReport
    ) -> list[Any]:
        """Run `blob` on the world's ranks; every rank's (unpickled) result. Raises
        `WorldGone` if the world was released before the run could start."""
        with self._run_lock:
            if not self.usable:
                raise WorldGone(self.dispatch.released or "ended")
            self.dispatch.cancel_idle()
            try:
                return self._run(options, blob, all_results, report)
            finally:
                self.idle_since = time.monotonic()
                if self.usable:
                    self.dispatch.arm_idle(self.keep_warm, self._expire)

    def _run(self, options, blob, all_results, report) -> list[Any]:
        d = self.dispatch
        report.job_id = uuid.uuid4().hex[:12]
        report.outcome = Outcome.RUNNING
        started = time.monotonic()
        first_reported = len(self.report.reported)
        sent_before = d.payload_bytes_sent
        # The driver's MLflow run now (this thread's): rank 0 logs into it.
        run_env = tracking.rank_environment()
        credentials = messages.SecretEnv(tracking.rank0_credentials())
        try:
            d.wait_ready()
            if d.relayed:
                done = self._carried(
                    options, report.job_id, blob, all_results, run_env, credentials
                )
            else:
                deadline = started + options.timeout if options.timeout else None
                order = (report.job_id, blob, all_results, run_env, credentials)
                with _run_store(options) as store:
                    done = d.run(
                        *order, deadline, options, logger.warning, self._thread.join, store
                    )
        except BaseException as exc:
            interrupted = isinstance(exc, KeyboardInterrupt)
            report.outcome = Outcome.INTERRUPTED if interrupted else Outcome.FAILED
            raise
        finally:
            self._fill(report, started, first_reported)
            self._trace(report, started)
            report.payload_bytes_sent = d.payload_bytes_sent - sent_before
        report.outcome = Outcome.SUCCEEDED
        report.frameworks = sorted({f for r in done for f in r.frameworks})
        tracking.log_job(
            np=options.np,
            launcher=report.launcher,
            backend=",".join(report.frameworks) or "none",
            wall_time_s=report.wall_time_s,
            outcome=report.outcome,
        )
        return [cloudpickle.loads(r.value) if r.has_value else None for r in done]

    def _carried(self, options, job_id, blob, all_results, env, rank0_env) -> list:
        """A relayed world's run (`relayed.carry_run`); a failed one ends its world."""
        from sparkdist.runner.driver.launch.relayed import carry_run

        self.dispatch.carried += 1
        try:
            return carry_run(self.dispatch, options, job_id, blob, all_results, env, rank0_env)
        except Exception:
            self._thread.join(EXIT_WAIT_S)
            raise

    def _fill(self, report: JobReport, started: float, first_reported: int) -> None:
        state = self.dispatch.state
        report.wall_time_s = time.monotonic() - started
        report.reported[:] = self.report.reported[first_reported:]
        if state is not None:
            report.processes = list(state.processes.started())
            if state.console.log_dir is not None:
                report.rank_logs = str(state.console.log_dir)

    def _trace(self, report: JobReport, started: float) -> None:
        """The run on the world's trace, which is written beside its rank logs: a run's
        trace is its world's so far (`report.trace`)."""
        state = self.dispatch.state
        if state is None or not state.trace.enabled:
            return
        ended = "succeeded" if report.outcome == Outcome.RUNNING else str(report.outcome)
        since_us = state.trace.now_us() - (time.monotonic() - started) * 1e6
        state.trace.run(f"run {report.job_id}", since_us, {"outcome": ended})
        try:
            report.trace = state.trace.write(state.console.save_files({}).parent)
        except OSError as exc:
            logger.warning("could not write the warm world's trace: %s", exc)

    def release(self, reason: str, wait_s: float | None = None) -> None:
        """Let the ranks return and the world's job end; wait until it did (at most
        `wait_s` seconds when given)."""
        self.dispatch.cancel_idle()
        if self.usable:
            logger.info("sparkdist: releasing the %s: %s", self.describe(), reason)
            if self.dispatch.relayed:
                from sparkdist.runner.driver.launch.relayed import release_world

                release_world(self.dispatch, reason)
        self.dispatch.release(reason)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(wait_s)

    def _expire(self, runs: int) -> None:
        """The idle timer: release the world unless a run started meanwhile (a run
        that waits for the lock then finds the world gone and starts a new one)."""
        if not self._run_lock.acquire(blocking=False):
            return
        try:
            if runs == self.dispatch.runs:
                self.release(f"idle for keep_warm={self.keep_warm:g}s")
        finally:
            self._run_lock.release()


@contextlib.contextmanager
def _run_store(options: RunnerOptions):
    """A run's own checkpoint store, as a cold job opens one: its own temporary
    directory (removed after the run), or the directory the user named."""
    store = CheckpointStore(options.checkpoint_dir, options.checkpoint_keep)
    try:
        yield store
    finally:
        store.close()


class WorldGone(SparkdistError):
    """The warm world was released before a run could start on it."""


EXIT_WAIT_S = 30.0
_lock = threading.Lock()
_current: WarmWorld | None = None


def current() -> WarmWorld | None:
    """This driver process's warm world, if one is kept."""
    world = _current
    return world if world is not None and world.usable else None


def run_warm(
    options: RunnerOptions, blob: bytes, all_results: bool, report: JobReport
) -> tuple[WarmWorld, list[Any]]:
    """Run on this process's warm world of `options`' shape, started if there is none
    (an unusable one, or one of another shape, is released first)."""
    global _current
    with _lock:
        world = _current
        if world is not None and world.usable and world.shape != shape(options):
            logger.warning(
                "sparkdist: a run of another shape (np=%s, launcher %s): releasing the %s",
                options.np,
                options.resolved_launcher(),
                world.describe(),
            )
            world.release("a run of another shape")
        if world is None or not world.usable:
            world = _current = WarmWorld(options)
            world.start()
    try:
        return world, world.run(options, blob, all_results, report)
    except WorldGone:  # released (idle) just before this run took it: a new world
        return run_warm(options, blob, all_results, report)


def release(world: WarmWorld | None, reason: str) -> None:
    """Release `world` (a runner's `close`); nothing if it is gone already."""
    if world is not None:
        world.release(reason)


LISTING_DIR = os.path.join(tempfile.gettempdir(), f"sparkdist-warm-worlds-{os.getuid()}")
"""Where each driver process of this machine lists the warm world it keeps, for
`sparkdist doctor` (a file per world, removed when the world ends)."""


def _list(world: WarmWorld) -> str | None:
    try:
        os.makedirs(LISTING_DIR, mode=0o700, exist_ok=True)
        path = os.path.join(LISTING_DIR, f"{os.getpid()}-{id(world)}.json")
        with open(path, "w") as f:
            json.dump(world.entry(), f)
        return path
    except OSError as exc:
        logger.debug("could not list the warm world for sparkdist doctor: %s", exc)
        return None


def _unlist(path: str | None) -> None:
    if path is not None:
        try:
            os.remove(path)
        except OSError:
            pass


def listed() -> list[dict[str, Any]]:
    """The warm worlds the driver processes of this machine keep (a killed driver's
    listing is left out: its process is gone, and so are its world's ranks)."""
    worlds = []
    try:
        names = sorted(os.listdir(LISTING_DIR))
    except OSError:
        return []
    for name in names:
        try:
            with open(os.path.join(LISTING_DIR, name)) as f:
                entry = json.load(f)
            os.kill(entry["pid"], 0)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        worlds.append(entry)
    return worlds


@atexit.register
def _release_at_exit() -> None:
    world = current()
    if world is not None:  # bounded: Spark may be going down at the same time
        world.release("the driver process exits", wait_s=EXIT_WAIT_S)
