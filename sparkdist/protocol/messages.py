"""Every message of a job's control channels, declared once.

A message is a typed record (a NamedTuple). On the wire it is a tuple tagged with
its kind, `(tag, *fields)`, pickled inside an authenticated `wire` frame. `encode`
makes that tuple; `decode` turns a received one back into its record, and raises
`MalformedMessage` for anything that is not one of the kinds a channel expects, with
the right number of fields of the right basic types. Every server answers such a
request with `Rejected` instead of leaving its peer waiting.

The channels (see docs/architecture.md):

* to the driver's service, first a hello (`TaskHello`, `SupervisorHello`, `RankHello`,
  or `WhereHello`, answered by the grouped stacks, or `WarmCarry`, a relayed warm world's
  run, answered when it ended);
  then a task reports `TASK_REPORTS`, a supervisor `SUPERVISOR_REPORTS`, and a rank
  sends `RANK_REQUESTS`, each answered with `Ok`, `Missing`, `Failed` or `Rejected`;
  the driver sends `Finish` or `Abort` to tasks and supervisors, `AgentPlaces` to task
  0, `Bye` to a supervisor whose exit it recorded, `KillRank` to the supervisor of a
  rank an in-process elastic world drops, and `Welcome` to a rank. A warm
  world's rank asks for its next run (`WarmNext`, answered by `WarmRun` or
  `WarmRelease`) and says when it finished one (`WarmDone`). A task's
  supervisors and ranks reach the driver through their task's relay: each one's frames
  are a stream of `Relayed` frames on the task's channel, ended by `RelayClosed`;
* an elastic job's plain task to its gang: `GangCheckIn`, answered by `GangSeat` (then
  the task runs like a barrier task) or `GangRelease`;
* mpirun's rsh agent to a task agent: `OrtedLaunch`, answered by `OrtedOutput` lines
  and `OrtedExit`, or `Rejected`; `Abort` when mpirun went before its daemon ended;

Other paths declare their own messages with `register` in their own module (tune's
are in `sparkdist.tune.messages`) and reuse the replies declared here.
"""

from __future__ import annotations

import functools
import typing
from typing import Any, NamedTuple

from sparkdist.protocol.processes import ProcessRecord

TAIL_LINES = 40
"""How many of a rank's last output lines its supervisor keeps and sends with its exit
(and the driver keeps, for the error that reports the rank's failure)."""


class MalformedMessage(ValueError):
    """A received message that is not one of the kinds its channel expects."""


class RequestRejected(RuntimeError):
    """The server answered a request with `Rejected`."""


_KINDS: dict[str, type] = {}


def register(tag: str):
    """Register a record class under its wire tag (a tag is taken once)."""

    def add(cls: type) -> type:
        if _KINDS.get(tag, cls) is not cls:
            raise ValueError(f"message tag {tag!r} is already taken by {_KINDS[tag]}")
        cls.tag = tag
        _KINDS[tag] = cls
        return cls

    return add


# --- hellos: the first message on a connection to the driver ------------------------


@register("task")
class TaskHello(NamedTuple):
    index: int
    host: str
    pid: int
    spark_task_id: int = -1
    """Spark's task attempt id (-1: unknown): how the driver finds the task's executor,
    to learn when it is decommissioned (`sparkdist/spark/decommission.py`)."""


@register("supervisor")
class SupervisorHello(NamedTuple):
    rank: int
    host: str
    pid: int


@register("rank")
class RankHello(NamedTuple):
    rank: int
    host: str
    pid: int


@register("where_hello")
class WhereHello(NamedTuple):
    """Where is each rank: answered once with `Ok(the grouped stacks, "" when no rank
    runs)`. A relayed job's client asks task 0's service so, through a plain Spark task,
    when it is interrupted (`runner/driver/launch/relayed.py`)."""

    why: str


@register("warm_carry")
class WarmCarry(NamedTuple):
    """A relay-mode warm world's run (or release), carried from the Spark Connect client
    by a plain Spark task to the world's service in barrier task 0: answered once the
    run ended with `Ok(the run's RelayOutcome, pickled)` (`runner/driver/launch/relayed.py`)."""

    job_id: str
    payload: bytes
    all_results: bool
    env: dict
    rank0_env: dict
    timeout_s: float | None
    stall_warning: float | None
    stall_timeout: float | None
    start_timeout: float | None
    """The client's: a rank that starts during the run (a relaunch) is watched against it."""
    release: str = ""
    """Not empty: release the world for this reason instead of running."""


# --- a task's and a supervisor's reports (one-way) -----------------------------------


@register("process")
class ProcessStarted(NamedTuple):
    record: ProcessRecord


@register("launcher_output")
class LauncherOutput(NamedTuple):
    lines: list


@register("launcher_exit")
class LauncherExit(NamedTuple):
    name: str
    exit_code: int
    rank: int = -1
    """The rank whose supervisor this launcher was (direct launcher); -1 for mpirun."""


@register("agent_place")
class AgentPlace(NamedTuple):
    """Where a task's agent listens (mpi launcher), for task 0's mpirun."""

    host: str
    port: int
    network: str


@register("task_lost")
class TaskLost(NamedTuple):
    """The sender lost its channel to task `index` (on `host`) while an orted of the job
    ran: task 0's launch relay lost a task's agent, or a task's agent lost task 0's
    relay. Said before the sender acts on the loss (mpirun, or the agent, then stops
    the job's daemons and SIGTERMs their ranks), so that the lost host explains the
    job, not a rank stopped because of it."""

    index: int
    host: str
    detail: str


@register("task_done")
class TaskDone(NamedTuple):
    leftover_pids: list


@register("output")
class RankOutput(NamedTuple):
    lines: list
    """(stream, line) pairs, stream "stdout" or "stderr"."""


@register("rank_exit")
class RankExit(NamedTuple):
    """The rank's end; `passed_on`: it was sent a SIGTERM its supervisor got (orted ending
    the job, its task stopping, an operator), so a signal it died of was not its doing."""

    exit_code: int
    tail: list
    passed_on: bool = False


@register("rank_stacks")
class RankStacks(NamedTuple):
    """The answer to `DumpStacks`: the rank's faulthandler dump (every thread's Python
    stack; "" when it did not answer in time) and, if asked, its NCCL trace."""

    request: int
    text: str
    nccl: bytes = b""


# --- the driver's orders ------------------------------------------------------------


@register("finish")
class Finish(NamedTuple):
    reason: str


@register("abort")
class Abort(NamedTuple):
    """Stop the job now. `leave_stacks`: a task was lost first (its stage may end with no
    answer, e.g. cancelled): a relayed job's supervisor leaves its rank's stacks on its
    host for the client (`protocol/left_stacks.py`) instead of removing them."""

    reason: str
    leave_stacks: bool = False


@register("bye")
class Bye(NamedTuple):
    pass


@register("kill_rank")
class KillRank(NamedTuple):
    """To a supervisor: SIGKILL your rank's process group now (a rank an in-process
    elastic world drops: it stopped, or is stuck, `stalls.StallWatch`); its end is then
    reported as any (`RankExit`). SIGKILL ends even a SIGSTOPped process."""

    reason: str


@register("dump_stacks")
class DumpStacks(NamedTuple):
    """To a supervisor: send your rank's stacks (`protocol/stack_dumps.py`) as
    `RankStacks(request, ...)`; with `nccl`, its NCCL flight recorder too."""

    request: int
    nccl: bool = False


@register("agent_places")
class AgentPlaces(NamedTuple):
    """Every task's `AgentPlace` in task order, to task 0 once all have arrived: the
    driver gathers them, as Spark's `allGather` would at a cost of a second or more
    (its tasks poll the barrier's answer once a second)."""

    places: list


class SecretEnv(dict):
    """Environment variables holding credentials: their values never show in a repr."""

    def __repr__(self) -> str:
        return f"SecretEnv({sorted(self)})"

    __str__ = __repr__


@register("welcome")
class Welcome(NamedTuple):
    payload: bytes
    """The pickled `main` and its arguments. Empty through a task's relay after the
    first: the relay gives each of its ranks the payload it got once."""
    send_result: bool
    job_id: str
    env: dict = SecretEnv()
    """Credentials for this rank only (rank 0's tracking credentials), set before `main`."""
    clock_us: float = -1.0
    """The driver's trace clock when it answered (µs since the job started): the rank
    maps its own clock to it (`rank_trace.start`); -1: the job records no trace."""


# --- a warm world's runs (`runner/driver/warm.py`, `runner/rank/warm.py`) ------------


@register("warm_next")
class WarmNext(NamedTuple):
    """A warm world's idle rank asks for the run after run `after` (0: the first); the
    driver answers when one comes (`WarmRun`) or the world is released (`WarmRelease`)."""

    after: int


@register("warm_run")
class WarmRun(NamedTuple):
    run: int
    """1 for the world's first run, then 2, 3...: a rank takes only the next one."""
    job_id: str
    payload: bytes
    signature: bytes
    """The payload's HMAC under this run's own key (`JobSecret.run_tag`)."""
    send_result: bool
    env: dict = SecretEnv()


@register("warm_release")
class WarmRelease(NamedTuple):
    reason: str


@register("warm_done")
class WarmDone(NamedTuple):
    """A rank finished run `run`: its pickled value when it sends one (`has_value`)."""

    run: int
    value: bytes
    has_value: bool
    frameworks: list


# --- a rank's requests --------------------------------------------------------------


@register("put")
class KvPut(NamedTuple):
    key: str
    value: Any


@register("get")
class KvGet(NamedTuple):
    key: str
    timeout_s: float


@register("log")
class Log(NamedTuple):
    text: str


@register("file")
class FileUpload(NamedTuple):
    name: str
    data: bytes


@register("result")
class Result(NamedTuple):
    value: bytes
    frameworks: list


@register("error")
class RankError(NamedTuple):
    traceback: str
    reason: str


@register("checkpoint_save")
class CheckpointSave(NamedTuple):
    step: int
    blob: bytes


@register("checkpoint_latest")
class CheckpointLatest(NamedTuple):
    """The newest checkpoint: (step, pickled state), (step, commit record) or None. A
    sharded one stays pinned for this rank until `CheckpointLoaded`."""


@register("checkpoint_loaded")
class CheckpointLoaded(NamedTuple):
    """The rank has read its sharded checkpoint: retention may remove it now."""


@register("checkpoint_steps")
class CheckpointSteps(NamedTuple):
    """The committed steps, oldest first."""


@register("checkpoint_due")
class CheckpointDue(NamedTuple):
    """Does the job want a checkpoint now, between `save(..., every=N)`'s steps (an
    elastic job about to grow, or to leave an executor being decommissioned)? Ok(bool)."""


@register("checkpoint_place")
class CheckpointPlace(NamedTuple):
    """Where this job's ranks write the shards of `step` (answered with a path or URL)."""

    step: int
    suffix: str = ""


@register("checkpoint_commit")
class CheckpointCommit(NamedTuple):
    """Every rank's shard and the metadata of `step` are written at `location`."""

    step: int
    world_size: int
    location: str
    kind: str


@register("report")
class Report(NamedTuple):
    """`sparkdist.report`: a rank's metrics at `step`; answered `Ok("prune")` when the
    trial the job runs for was pruned, else `Ok()`."""

    step: int
    metrics: dict


@register("alive")
class Alive(NamedTuple):
    """A rank's signs of life the driver cannot see in its output: how many loader
    batches, elastic commits and checkpoint saves it made so far (`sparkdist.reporting
    .alive`, at most once a second), and the job trace's events recorded since the
    last (`rank_trace`: `(ph, lane, name, ts_us, dur_us, args)` each)."""

    counts: dict
    events: list = []


@register("elastic_world")
class ElasticWorld(NamedTuple):
    """An in-process elastic rank (`sparkdist.elastic.run`) asks for the first world
    generation newer than `after` (-1: the one to join). Answered with `Ok(Generation)`
    once it forms, `Missing` when `timeout_s` passes first, `Failed` when the job stops.
    `rank` is the rank's launch rank (its `RANK` at start), which never changes.
    `done`: the rank's function returned in generation `after`; answered at once, with a
    newer generation that includes the rank (to run again in) or `Missing` (it is done:
    no grown world forms with it in this run). `broke`: the rank's collective in
    generation `after` failed or timed out, and it waits for the next: once every member
    says so and none is known lost, the driver forms the next of them all."""

    rank: int
    after: int
    timeout_s: float
    done: bool = False
    broke: bool = False


class Generation(NamedTuple):
    """One formed world of an in-process elastic job: the driver forms it
    (`runner/driver/membership.py`), the ranks join it (`elastic/generations.py`)."""

    number: int
    members: tuple[int, ...]
    """Launch ranks, in world-rank order."""
    reason: str = ""
    planned: bool = False
    """The ranks it leaves out leave at their next commit (a decommission notice): they
    are alive, and the current world's collectives are not to be aborted."""

    def world_rank(self, launch_rank: int) -> int | None:
        """This launch rank's rank in the world, or None if it is not a member."""
        return self.members.index(launch_rank) if launch_rank in self.members else None

    @property
    def size(self) -> int:
        return len(self.members)


# --- a task's relay (`runner/task/relay.py`) and the driver, over the task's channel --


@register("relayed")
class Relayed(NamedTuple):
    """A frame of the task's local peer `stream` (a supervisor or a rank on its host):
    from the task, its hello, then its messages; from the driver, what it sends it."""

    stream: int
    body: Any


@register("relay_closed")
class RelayClosed(NamedTuple):
    """From the task: local peer `stream`'s connection ended (lost, unless its last
    message came). From the driver: the peer is done, close its connection."""

    stream: int


# --- an elastic job's plain tasks and its gang (`runner/driver/launch/gang.py`) -------------


@register("gang_check_in")
class GangCheckIn(NamedTuple):
    """A plain Spark task of an elastic job is running and offers its slot."""

    partition: int
    host: str
    pid: int
    spark_task_id: int = -1
    """Spark's task attempt id (-1: unknown): a task on an executor being decommissioned
    is not seated."""


@register("gang_seat")
class GangSeat(NamedTuple):
    """The task is task `index` of a world of `num_tasks` tasks (`num_ranks` ranks),
    whose service listens at `driver`."""

    index: int
    num_tasks: int
    num_ranks: int
    driver: str


@register("gang_release")
class GangRelease(NamedTuple):
    """The task is not needed: it ends, and frees its slot."""

    reason: str


# --- mpirun's rsh agent and a task agent --------------------------------------------


@register("orted")
class OrtedLaunch(NamedTuple):
    command: str


@register("orted_output")
class OrtedOutput(NamedTuple):
    text: str


@register("orted_exit")
class OrtedExit(NamedTuple):
    exit_code: int


# --- a remote trial and the tune service --------------------------------------------


# --- replies ------------------------------------------------------------------------


@register("ok")
class Ok(NamedTuple):
    value: Any = None


@register("missing")
class Missing(NamedTuple):
    key: str


@register("failed")
class Failed(NamedTuple):
    """The request was understood but could not be carried out."""

    error: Any


@register("rejected")
class Rejected(NamedTuple):
    """The request was not understood (unknown kind, wrong fields) or is refused."""

    reason: str


HELLOS = (TaskHello, SupervisorHello, RankHello, WhereHello, WarmCarry)
RELAY_FRAMES = (Relayed, RelayClosed)
TASK_REPORTS = (
    ProcessStarted,
    AgentPlace,
    TaskLost,
    LauncherOutput,
    LauncherExit,
    TaskDone,
) + RELAY_FRAMES
SUPERVISOR_REPORTS = (ProcessStarted, RankOutput, RankExit, RankStacks)
RANK_REQUESTS = (
    KvPut,
    KvGet,
    Log,
    FileUpload,
    Result,
    RankError,
    CheckpointSave,
    CheckpointLatest,
    CheckpointLoaded,
    CheckpointSteps,
    CheckpointPlace,
    CheckpointCommit,
    CheckpointDue,
    Report,
    ElasticWorld,
    Alive,
    WarmNext,
    WarmDone,
)
ORDERS = (Finish, Abort, Bye, Rejected, DumpStacks, KillRank)
TASK_ORDERS = ORDERS + (AgentPlaces,) + RELAY_FRAMES
RANK_REPLIES = (Welcome, Ok, Missing, Failed, Rejected, WarmRun, WarmRelease)
AGENT_REPLIES = (OrtedOutput, OrtedExit, Rejected)
GANG_ORDERS = (GangSeat, GangRelease, Rejected)


def encode(message: NamedTuple) -> tuple:
    """The wire form of `message`: its tag, then its fields."""
    return (message.tag, *message)


def decode(raw: Any, expected: tuple[type, ...]) -> Any:
    """The record that `raw` encodes, if it is one of the `expected` kinds."""
    if not isinstance(raw, tuple) or not raw or not isinstance(raw[0], str):
        raise MalformedMessage(f"not a tagged message: {_short(raw)}")
    cls = _KINDS.get(raw[0])
    if cls not in expected:
        names = ", ".join(k.tag for k in expected)
        raise MalformedMessage(f"unknown request {raw[0]!r} here (expected one of: {names})")
    fields = raw[1:]
    required = len(cls._fields) - len(cls._field_defaults)
    if not required <= len(fields) <= len(cls._fields):
        raise MalformedMessage(
            f"{raw[0]!r} takes {len(cls._fields)} fields {cls._fields}, got {len(fields)}"
        )
    record = cls(*fields)
    for name, (type_name, kinds) in _basic_types(cls).items():
        value = getattr(record, name)
        if not isinstance(value, kinds) or (type_name == "int" and isinstance(value, bool)):
            raise MalformedMessage(f"{raw[0]!r}: field {name} must be {type_name}")
    return record


_BASIC = {
    "int": int,
    "str": str,
    "bytes": bytes,
    "bool": bool,
    "list": list,
    "tuple": tuple,
    "dict": dict,
    "float": (int, float),
}


@functools.cache
def _basic_types(cls: type) -> dict[str, tuple[str, Any]]:
    """The fields of `cls` annotated with a plain built-in type, checked on decode."""
    hints = typing.get_type_hints(cls)
    checks = {}
    for name in cls._fields:
        type_name = getattr(hints.get(name), "__name__", None)
        if type_name in _BASIC:
            checks[name] = (type_name, _BASIC[type_name])
    return checks


def reply_to(raw: Any, expected: tuple[type, ...]) -> Any:
    """Decode a server's reply; raise `RequestRejected` when it refused the request."""
    reply = decode(raw, expected + (Rejected,))
    if isinstance(reply, Rejected):
        raise RequestRejected(reply.reason)
    return reply


def _short(raw: Any) -> str:
    text = repr(raw)
    return text if len(text) <= 80 else text[:77] + "..."
