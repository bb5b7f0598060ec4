"""The relayed kind: a Spark Connect client that the executors cannot reach.

Normally every task, supervisor and rank connects to the job's service on the driver.
A Connect client (a laptop, a sandbox) may be unreachable from the cluster. Then the
job's service runs in barrier task 0 instead (same `JobState`, same per-job secret), the
other tasks and the ranks connect there, and when the job ends task 0 returns
everything the client would have seen live (rank-prefixed log lines, rank 0's or every
rank's result, the first failure, processes, files, reported metrics) as the stage's
output row. The
client replays it: prints the lines, returns the results or raises the same error.

A cancelled stage returns no row, and while the stage runs it may hold every task slot
(no Spark job of the client's could reach the ranks). So when the client is interrupted
(Ctrl-C, SIGTERM to `sparkdist run`) it cancels the stage first: each rank's
supervisor, cut off from its task, takes its rank's stacks (and NCCL dump), leaves them
on its host and only then stops the rank (`protocol/left_stacks.py`). In the slots the
stage freed, the client then runs plain Spark tasks, as many as the stage had (the
scheduler spreads them over the executors), that collect those files, in rounds until
every rank's is in or `LEFT_WAIT_S` ran out, and shows them grouped; ranks whose stacks
were not found are named in one line.

Whether the executors reach the client is the Spark layer's call
(`sparkdist.spark.Cluster.service_place`).

Task code imports nothing of the driver's: the `RelayPlan` travels in the task's
`LaunchSpec` and task 0 calls its `host` (the `spark_task.ServiceHost` interface), so
this module is loaded in task 0 (by unpickling the plan) only in relay mode, where task 0
runs the driver's part by design.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass, field

import cloudpickle

from sparkdist.checkpoint.driver.store import CheckpointStore
from sparkdist.errors import JobTimeoutError, SparkdistError
from sparkdist.network import join_address, split_address
from sparkdist.protocol import left_stacks, messages, wire
from sparkdist.protocol.processes import ProcessRecord
from sparkdist.runner.driver.console import RecordingConsole, spans
from sparkdist.runner.driver.job_spec import JobSpec, RunnerOptions
from sparkdist.runner.driver.job_state import JobState
from sparkdist.runner.driver.launch.api import AttemptPlan, FixedSizeKind, World
from sparkdist.runner.driver.launch.barrier import JOIN_TIMEOUT_S, BarrierStage
from sparkdist.runner.driver.service import DriverService
from sparkdist.runner.driver.stacks import RankStacks
from sparkdist.runner.driver.stalls import StallWatch, show_where, shown
from sparkdist.runner.task.spark_task import remove_task_dirs, run_barrier_task
from sparkdist.spark import Cluster, ServicePlace, active_cluster, job_tag
from sparkdist.trace.recorder import JobTrace

logger = logging.getLogger(__name__)

TASKS_DONE_GRACE_S = 10.0
IDLE_GRACE_S = 30.0
"""How much longer than `keep_warm` a relayed warm world waits for its client's next run
or release before it releases itself (the client may have been killed)."""
LEFT_WAIT_S = 30.0
"""How long an interrupted client looks for the stacks its ranks left: the cancelled
tasks' Python workers are killed (`spark.python.task.killTimeout`, 2 s by default), each
supervisor takes its rank's stacks (`stack_dumps.WAIT_S`), and a Spark job collects them."""
ROUND_PAUSE_S = 0.5
"""Between two rounds of collecting tasks that did not find every rank's stacks."""


class RelayedKind(FixedSizeKind):
    """An `api.LaunchKind`: a barrier stage whose task 0 serves the job; the client
    replays what it did when the stage ends. The job's checkpoint store is task 0's
    (`HostedJob`), in `checkpoint_dir`: the client's plan holds a `NoStore`."""

    def __init__(self, options: RunnerOptions, cluster: Cluster, place: ServicePlace):
        super().__init__(options)
        self.cluster = cluster
        self.place = place
        _check_relayed(options)

    def form(self, plan: AttemptPlan, why: str) -> World:
        opts = self.options
        if plan.warm is not None:
            plan.warm.relayed = True  # the client's runs go to task 0 (`carry`)
        state = plan.new_state(opts.num_ranks)
        keep_warm = opts.keep_warm if plan.warm is not None else None
        _check_slots(self.cluster, opts, announcing=keep_warm is not None)
        service = DriverService(state, plan.secret, self.place.bind, self.place.advertise)
        relay = RelayPlan(
            job=state.job,
            start_timeout=opts.start_timeout,
            timeout=opts.timeout,
            stall_warning=opts.stall_warning,
            stall_timeout=opts.stall_timeout,
            launcher_expected=plan.launcher == "mpi",
            checkpoint_dir=opts.checkpoint_dir,
            checkpoint_keep=opts.checkpoint_keep,
            keep_warm=keep_warm,
            dispatch_type=None if plan.warm is None else type(plan.warm),
            trace=opts.trace,
        )
        spec = plan.spec(opts.num_ranks, join_address(*service.address), relay)
        logger.info(
            "sparkdist job %s: %d ranks, launcher %s, on the cluster",
            plan.job_id,
            spec.num_ranks,
            plan.launcher,
        )
        description = plan.description(spec.num_ranks, "relayed barrier stage")
        return World(state, service, RelayedStage(self.cluster, spec, state, description))


def _check_slots(cluster: Cluster, options: RunnerOptions, announcing: bool) -> None:
    """The job's tasks need their slots; a relayed warm world one more, whose first task
    frees it at once for the Spark tasks that carry the runs."""
    extra = options.ranks_per_task if announcing else 0
    try:
        cluster.check_slots(
            options.num_ranks + extra, options.ranks_per_task, options.start_timeout
        )
    except SparkdistError as exc:
        if not announcing:
            raise
        raise SparkdistError(
            f"{exc} A warm world in relay mode takes one task slot more than its "
            f"{options.num_ranks} ranks: the client carries each run to it by a Spark task."
        ) from None


def _check_relayed(options: RunnerOptions) -> None:
    """The job's service runs in barrier task 0: say so once, and require storage that
    outlives that task when a relaunch must resume from it."""
    if options.relaunch_limit and options.checkpoint_dir is None:
        raise SparkdistError(
            "the executors cannot reach this Spark Connect client, so the job's service "
            "runs in barrier task 0, and relaunches (max_failures="
            f"{options.relaunch_limit}) resume from checkpoints that must outlive that "
            "task: pass checkpoint_dir= a directory every executor shares (a DBFS path or "
            "a Unity Catalog volume such as /Volumes/..., or a mounted file system)."
        )
    logger.warning(
        "sparkdist: the executors cannot connect to this Spark Connect client, so the job "
        "runs in relay mode: its service runs inside the cluster (barrier task 0), and the "
        "ranks' logs, results and errors arrive here when the job ends, not live."
    )


class RelayedStage(BarrierStage):
    """A barrier stage whose task 0 serves the job: the client learns how it went from
    the stage's output when it ends, and replays that."""

    # Beyond the job's own limits, which task 0 enforces: the time a stage may wait for
    # its slots and its tasks take to stop.
    GRACE_S = 120.0

    def _run_stage(self) -> list[bytes]:
        """A relayed warm world's stage has its announcing task first: its value, task
        0's service address, goes to the world's dispatch as soon as it comes."""
        if not self.spec.relay.announces:
            return super()._run_stage()
        outputs = self.spark.run_barrier_stage(
            self.spec.num_tasks + 1,
            functools.partial(run_barrier_task, self.spec),
            self.group,
            self.description,
            announce=lambda value: self.state.warm.hosted_at(value.decode()),
        )
        return outputs[1:]

    def wait(self, start_deadline: float, deadline: float | None, launcher_expected: bool) -> None:
        limit = None if deadline is None else deadline - time.monotonic() + self.GRACE_S
        try:
            self._thread.join(timeout=limit)
        except KeyboardInterrupt:
            interrupted = time.monotonic()
            logger.info("cancelling Spark operations tagged %s", self.group)
            self.spark.cancel(self.group)  # each supervisor leaves its rank's stacks
            logger.warning("%s", self.where(interrupted))
            raise
        if self._thread.is_alive():
            raise JobTimeoutError(
                "timeout: the relayed job's Spark stage had not ended when the job's time "
                "limit ran out (the stage may still be waiting for task slots); it was "
                "cancelled."
            )
        if self.outputs is None:
            self.state.failures.wait(None, None, False)  # raises the stage's failure
            return
        replay(cloudpickle.loads(self.outputs[0]), self.state)

    def where(self, interrupted: float) -> str:
        """Where each rank was, from the stacks its supervisor left when the cancelled
        stage cut it off (the full ones go to the rank logs); or why not, in one line."""
        job, found, problem = self.spec.job, {}, ""
        deadline = interrupted + LEFT_WAIT_S
        while len(found) < self.spec.num_ranks and time.monotonic() < deadline:
            if problem:
                time.sleep(ROUND_PAUSE_S)
            raws, problem = self._collect(deadline)
            for rank, host, text, nccl in (e for raw in raws for e in left_stacks.entries(raw)):
                found[rank] = (host, text, nccl)
            problem = problem or "the collecting tasks found none on their hosts"
        if not found:
            return (
                f"sparkdist job {job.job_id}: interrupted; where each rank was is unknown: no "
                f"rank's stacks were found within {LEFT_WAIT_S:g}s ({problem})"
            )
        answers = {rank: RankStacks(host, text) for rank, (host, text, _) in found.items()}
        dumps = {rank: nccl for rank, (_, _, nccl) in found.items() if nccl}
        after = f"shown {time.monotonic() - interrupted:.1f}s after the interrupt"
        text = shown(self.state, "interrupted", answers, dumps, after)
        missing = sorted(set(range(self.spec.num_ranks)) - set(found))
        if missing:
            text += f"\nRanks {spans(missing)} left no stacks within {LEFT_WAIT_S:g}s ({problem})."
        return text

    def _collect(self, deadline: float) -> tuple[list[bytes], str]:
        """One round: as many plain tasks as the stage had collect the job's stacks on
        their hosts; what they returned, or why nothing."""
        tag, raws, problem = f"{self.group}-where", [], []
        collect = functools.partial(collect_left, self.spec.job.job_id)

        def run() -> None:
            try:
                description = "sparkdist: where each rank was"
                raws.extend(self.spark.run_tasks(self.spec.num_tasks, collect, tag, description))
            except Exception as exc:  # noqa: BLE001 - said in the one line of `where`
                problem.append(f"the Spark job collecting them failed: {type(exc).__name__}")

        thread = threading.Thread(target=run, name=tag, daemon=True)
        thread.start()
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            self.spark.cancel(tag)
            return [], "the last Spark job collecting them did not end in time (no free task slot?)"
        return raws, problem[0] if problem else ""

    def stop(self, finished: bool) -> list[ProcessRecord]:
        if self._thread.is_alive():
            logger.info("cancelling Spark operations tagged %s", self.group)
            self.spark.cancel(self.group)
            self._thread.join(timeout=JOIN_TIMEOUT_S)
        return self._wait_local_gone()


def carry_run(warm, options, job_id, blob, all_results, env, rank0_env) -> list:
    """The client's run on a relayed warm world (`warm`, its `WarmDispatch`): carried to
    task 0's service, its outcome replayed here (lines, results, the error); every rank's
    `WarmDone`."""
    limits = (options.timeout, options.stall_warning, options.stall_timeout, options.start_timeout)
    order = messages.WarmCarry(job_id, blob, all_results, env, rank0_env, *limits)
    outcome = carry(warm.address, warm.secret, order, warm.state.job.job_id)
    replay(outcome, warm.state)
    return [
        messages.WarmDone(warm.runs, value or b"", value is not None, outcome.frameworks)
        for value in outcome.results
    ]


def release_world(warm, reason: str) -> None:
    """Release a relayed warm world: tell task 0's service (a Spark task carries it), or
    cancel the world's stage if that cannot be done."""
    world_id = warm.state.job.job_id
    try:
        if warm.address is None:
            raise SparkdistError("the world's service was not announced yet")
        order = messages.WarmCarry("", b"", False, {}, {}, None, None, None, None, reason)
        carry(warm.address, warm.secret, order, world_id)
    except Exception as exc:  # noqa: BLE001 - the world's stage is cancelled instead
        logger.info("sparkdist: cancelling the warm world's stage: %s", exc)
        try:
            cancel_world(world_id)
        except Exception as cancel_error:  # noqa: BLE001 - the session may be gone
            logger.warning(
                "sparkdist: could not release the warm world (%s); task 0 releases it "
                "itself %gs after keep_warm",
                cancel_error,
                IDLE_GRACE_S,
            )


def carry(address: str, secret: wire.JobSecret, order: messages.WarmCarry, world_id: str):
    """The client's side of a relayed warm world's run (or release): a plain Spark task
    takes `order` to task 0's service at `address` and brings back the run's
    `RelayOutcome`. Interrupted, the client cancels that task and the world's stage."""
    spark = active_cluster()
    tag = f"{job_tag(world_id)}-{order.job_id or 'release'}"
    what = "release" if order.release else f"run {order.job_id}"
    task = functools.partial(carry_task, address, secret, order)
    try:
        raw = spark.run_tasks(1, task, tag, f"sparkdist: the warm world's {what}")[0]
    except KeyboardInterrupt:
        spark.cancel(tag)
        cancel_world(world_id)
        raise
    return cloudpickle.loads(raw)


def carry_task(address: str, secret: wire.JobSecret, order: messages.WarmCarry, _index) -> bytes:
    """A plain Spark task's: hand `order` to the warm world's service, wait for its end."""
    channel = wire.connect(split_address(address), secret)
    try:
        reply = channel.request(messages.encode(order))
    finally:
        channel.close()
    reply = messages.decode(reply, (messages.Ok, messages.Failed, messages.Rejected))
    if not isinstance(reply, messages.Ok):
        raise SparkdistError(f"the warm world's service did not take the run: {reply}")
    return reply.value


def cancel_world(world_id: str) -> None:
    """Cancel a relayed warm world's stage (each supervisor leaves its rank's stacks)."""
    active_cluster().cancel(job_tag(world_id))


def collect_left(job_id: str, _index: int) -> bytes:
    """A plain Spark task's, after the job's stage was cancelled: the stacks the job's
    supervisors left on this host (`left_stacks.collect`); the directories its killed
    tasks left go."""
    remove_task_dirs(job_id)
    return left_stacks.collect(job_id)


@dataclass(frozen=True)
class RelayPlan:
    """What task 0 needs to serve the job in the client's place."""

    job: JobSpec
    start_timeout: float
    timeout: float | None
    launcher_expected: bool
    checkpoint_dir: str | None
    checkpoint_keep: int = 2
    stall_warning: float | None = None
    stall_timeout: float | None = None
    keep_warm: float | None = None
    """A warm world's: its runs come from the client through plain Spark tasks
    (`messages.WarmCarry`), and the stage's first task only announces task 0's service."""
    dispatch_type: type | None = None
    """A warm world's: the client's `warm.WarmDispatch` class, of which task 0 makes the
    world's own (passed, not imported: the warm module runs jobs through this one)."""
    trace: bool = True
    """Record the job's trace (the ranks' tracks travel back in the `RelayOutcome`)."""

    @property
    def announces(self) -> bool:
        """The stage has one task more, first, which returns task 0's service address
        at once: the client learns where to carry runs, and its slot is where they go."""
        return self.keep_warm is not None

    def host(self, secret: wire.JobSecret, host: str) -> HostedJob:
        """Start serving the job in barrier task 0 (`spark_task.ServiceHost`)."""
        hosted = HostedJob(self, secret, host)
        hosted.start()
        return hosted


@dataclass
class RelayOutcome:
    """Everything the client gets back from task 0 at the end of a relayed job."""

    lines: list[tuple[str, str]] = field(default_factory=list)
    """(stream, text) of everything the client would have printed, in order."""
    results: list[bytes | None] = field(default_factory=list)
    error: bytes | None = None
    """The job's error (cloudpickled), as the client would have raised it."""
    outside_user_code: str | None = None
    processes: list[ProcessRecord] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)
    frameworks: list[str] = field(default_factory=list)
    reported: list = field(default_factory=list)
    """The ranks' `sparkdist.report` calls (`metrics.Reported`), in arrival order."""
    stragglers: list[str] = field(default_factory=list)
    trace: dict | None = None
    """Task 0's trace of the job (the ranks' tracks), for the client's (`JobTrace.merge`)."""


class HostedJob:
    """Task 0's stand-in for the driver: the job's service and its wait, in the cluster."""

    def __init__(self, plan: RelayPlan, secret: wire.JobSecret, host: str):
        self.plan = plan
        self.outcome = RelayOutcome()
        self.console = RecordingConsole()
        self.checkpoints = CheckpointStore(plan.checkpoint_dir, plan.checkpoint_keep)
        trace = JobTrace(plan.job.job_id, enabled=plan.trace)
        self.state = JobState(
            plan.job, console=self.console, checkpoints=self.checkpoints, trace=trace
        )
        self.service = DriverService(self.state, secret, host, host)
        self.address = f"{self.service.address[0]}:{self.service.address[1]}"
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="sparkdist-relay", daemon=True)
        self._lines_sent = 0
        if plan.keep_warm is not None:
            self._start_warm(secret)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        started = time.monotonic()
        plan = self.plan
        try:
            with StallWatch(self.state, plan, plan.job.job_id, self._announce):
                self.state.failures.wait(
                    start_deadline=started + plan.start_timeout,
                    deadline=started + plan.timeout if plan.timeout else None,
                    launcher_expected=plan.launcher_expected,
                )
            self.state.stop("finish", "done")
        except BaseException as exc:  # noqa: BLE001 - travels to the client
            self._error = exc
            show_where(self.state, exc, self._announce)
            self.state.stop("abort", f"job failed: {type(exc).__name__}")
        finally:
            if self.state.warm is not None:
                self._cancel_idle()
                self.state.warm.world_ended(self._error)

    def _announce(self, text: str) -> None:
        """A stall warning or a straggler: the client shows it with the job's lines."""
        for line in text.splitlines():
            self.console.write("stderr", f"[sparkdist] {line}")

    def abort(self, reason: str) -> None:
        """Task 0 itself failed: stop the job and the service (the stage fails)."""
        self.state.stop("abort", reason)
        self.service.close()
        self.checkpoints.close()

    def finish(self, num_tasks: int) -> bytes:
        """After task 0's own part ended: wait for the others, then pack the outcome."""
        self._thread.join()
        state = self.state
        state.tasks.wait_done(min(state.tasks.live_count(), num_tasks), TASKS_DONE_GRACE_S)
        self.service.close()
        self.checkpoints.close()
        outcome = self.outcome
        outcome.lines = self._new_lines()
        outcome.results = state.rank_records.results()
        outcome.processes = state.processes.started()
        outcome.files = dict(state.files)
        outcome.frameworks = list(state.rank_records.frameworks)
        outcome.reported = list(state.metrics.reported)
        outcome.stragglers = list(state.life.stragglers.notes)
        outcome.trace = state.trace.to_dict() if state.trace.enabled else None
        if self._error is not None:
            outcome.error = cloudpickle.dumps(self._error)
            outcome.outside_user_code = state.failures.outside_user_code()
        return cloudpickle.dumps(outcome)

    def _new_lines(self) -> list[tuple[str, str]]:
        """The lines the client has not got yet (a warm world's runs took theirs)."""
        lines = self.console.lines[self._lines_sent :]
        self._lines_sent += len(lines)
        return list(lines)

    # --- a relayed warm world: runs carried from the client ------------------------

    def _start_warm(self, secret: wire.JobSecret) -> None:
        dispatch = self.plan.dispatch_type()
        dispatch.carry = self.carry
        self.state.warm = dispatch
        dispatch.attach(self.state, secret)
        self._arm_idle()

    def carry(self, order: messages.WarmCarry) -> bytes:
        """One run the client carried here (or its release): the run's outcome, pickled,
        when every rank finished it or the world ended."""
        warm, state, outcome = self.state.warm, self.state, RelayOutcome()
        self._cancel_idle()
        if order.release:
            warm.release(order.release)
            return cloudpickle.dumps(outcome)
        first_reported = len(state.metrics.reported)
        deadline = time.monotonic() + order.timeout_s if order.timeout_s else None
        run = (order.job_id, order.payload, order.all_results, order.env, order.rank0_env)
        store = CheckpointStore(self.plan.checkpoint_dir, self.plan.checkpoint_keep)
        try:  # the run resumes from its own checkpoints only, as a cold job does
            done = warm.run(*run, deadline, order, self._announce, self._thread.join, store)
            outcome.results = [r.value if r.has_value else None for r in done]
            outcome.frameworks = sorted({f for r in done for f in r.frameworks})
        except BaseException as exc:  # noqa: BLE001 - travels to the client
            outcome.error = cloudpickle.dumps(exc)
        finally:
            store.close()
        if not warm.over:
            self._arm_idle()
        outcome.lines = self._new_lines()
        outcome.reported = list(state.metrics.reported[first_reported:])
        outcome.processes = state.processes.started()
        return cloudpickle.dumps(outcome)

    def _arm_idle(self) -> None:
        """The backstop for a client that went away: the client releases an idle world
        itself after `keep_warm`; task 0 does `IDLE_GRACE_S` later."""
        self.state.warm.arm_idle(self.plan.keep_warm + IDLE_GRACE_S, self._expire)

    def _cancel_idle(self) -> None:
        if self.state.warm is not None:
            self.state.warm.cancel_idle()

    def _expire(self, runs: int) -> None:
        if self.state.warm.runs == runs:
            self.state.warm.release(
                f"no run came from the client for keep_warm={self.plan.keep_warm:g}s"
            )


def replay(outcome: RelayOutcome, state: JobState) -> None:
    """Give the client's `state` what task 0 saw, print the job's lines, raise its error."""
    for stream, line in outcome.lines:
        state.console.write(stream, line)
    for process in outcome.processes:
        state.processes.record(process)
    state.files.update(outcome.files)
    state.rank_records.frameworks = list(outcome.frameworks)
    for entry in outcome.reported:
        state.metrics.add(entry.rank, entry.step, entry.metrics, entry.time)
    state.life.stragglers.notes += outcome.stragglers
    if getattr(outcome, "trace", None):  # an outcome from an older task 0 has none
        state.trace.merge(outcome.trace)
    for rank, result in enumerate(outcome.results):
        if result is not None:
            state.ranks[rank].result = result
            state.ranks[rank].has_result = True
    if outcome.error is not None:
        if outcome.outside_user_code:
            state.failures.note_outside(outcome.outside_user_code)
        raise cloudpickle.loads(outcome.error)
