"""What a job is and how it ended: the runner's concepts in one room, read first.

* `JobSpec`: what one attempt's job is, as the driver tells every rank (built by
  `launch.api.AttemptPlan.new_state`);
* `Outcome` and `JobReport`: how the job ended and what it did (`runner.last_job`);
* `RunnerOptions`: what the user asked for, checked once: `HorovodRunner`'s (and so
  `TorchDistributor`'s and `sparkdist.tune`'s) settings as one frozen value, each also a
  flag of `sparkdist run`, from which each job's specs are built.

`job.run_job` is the loop that runs a job's attempts and fills its report;
`job_state.JobState` is what the driver knows while one runs. `np` keeps its sign as the
user gave it (`np < 0`: ranks on the driver); the number of ranks is `num_ranks`, always
positive.
"""

from __future__ import annotations

import enum
import os
from argparse import BooleanOptionalAction
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from sparkdist.protocol import messages
from sparkdist.protocol.launch import mpirun_available
from sparkdist.protocol.processes import ProcessRecord
from sparkdist.roles import SERVERS, Roles
from sparkdist.runner.driver.metrics import Reported, last_by_rank

if TYPE_CHECKING:
    from sparkdist.trace.picture import Timeline


@dataclass
class JobSpec:
    """What the job is, as the driver tells every rank when it says hello."""

    job_id: str
    num_ranks: int
    payload: bytes
    all_results: bool
    log_mode: str
    ranks_per_task: int = 1
    """Task i runs ranks i * ranks_per_task ... (i + 1) * ranks_per_task - 1."""
    roles: Roles | None = None
    """A parameter-server job's roles: its server ranks stop when the chief is done."""
    rank0_env: messages.SecretEnv = field(default_factory=messages.SecretEnv, repr=False)
    """Credentials only rank 0 gets (with its `Welcome`, over the encrypted channel)."""
    in_process_min_np: int | None = None
    """An elastic job under the direct launcher: the fewest ranks its world may re-form
    with in process (`membership.py`); None: a loss relaunches the job."""

    def server_rank(self, rank: int) -> bool:
        """A parameter-server job's worker or ps: a TensorFlow server that never returns."""
        return self.roles is not None and self.roles.role_of(rank)[0] in SERVERS

    def tolerates_loss(self, rank: int) -> bool:
        """A parameter-server worker: its coordinator reschedules what it was running."""
        return self.roles is not None and self.roles.role_of(rank)[0] == "worker"

    @property
    def num_tasks(self) -> int:
        return self.num_ranks // self.ranks_per_task


class Outcome(str, enum.Enum):
    """How a job ended (`JobReport.outcome`, MLflow's `sparkdist.outcome` tag). Each is
    equal to its text: `runner.last_job.outcome == "succeeded"`."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    RESIZED = "resized"
    """Stopped to relaunch with another number of ranks (an elastic job)."""

    def __str__(self) -> str:
        return self.value


@dataclass
class JobReport:
    """What the last job did: kept on the runner as `runner.last_job`."""

    job_id: str
    np: int
    launcher: str
    name: str = "job"
    """What runs: the function's (or script's) name."""
    outcome: Outcome = Outcome.RUNNING
    wall_time_s: float = 0.0
    processes: list[ProcessRecord] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)
    frameworks: list[str] = field(default_factory=list)
    """The distributed frameworks rank 0 had imported (torch, horovod, tensorflow...)."""
    attempts: int = 1
    """How many times the job was launched (more than 1 after relaunches)."""
    failures: list[str] = field(default_factory=list)
    """Why each relaunched attempt failed, in order."""
    reformed: list[str] = field(default_factory=list)
    """Why an in-process elastic world re-formed without a relaunch, in order (a grow's
    entry starts with `grew:`)."""
    reported: list[Reported] = field(default_factory=list)
    """Every `sparkdist.report` call of the ranks, in the order the driver got them
    (filled while the job runs)."""
    payload_bytes: int = 0
    """The size of the pickled `main` and its arguments."""
    driver_connections_max: int = 0
    """The most connections the driver's service held at once in the last attempt: one
    per Spark task (its ranks and supervisors come through the task's relay)."""
    payload_bytes_sent: int = 0
    """Bytes of payload the driver's service sent in the last attempt: once per task."""
    rank_logs: str | None = None
    """The directory of the last attempt's `rank-N.log` files on the driver (None: no
    rank line reached the driver)."""
    stragglers: list[str] = field(default_factory=list)
    """What the driver said of slow ranks in the last attempt (named, then recovered),
    in order (`stalls.Stragglers`)."""
    trace: str | None = None
    """The job's trace file (Chrome trace JSON, `sparkdist/trace/format.py`) on the
    driver, beside the rank logs; None with `trace=False`."""

    def timeline(self) -> Timeline:
        """The job's picture: a row per rank, shown in a notebook (`Timeline`)."""
        from sparkdist.trace.picture import Timeline

        if self.trace is None:
            raise ValueError(
                f"job {self.job_id} wrote no trace: run it with HorovodRunner(trace=True) "
                "(the default)"
            )
        return Timeline.load(self.trace)

    @property
    def metrics(self) -> dict[str, float]:
        """Rank 0's last reported value of each metric."""
        return self.metrics_by_rank.get(0, {})

    @property
    def metrics_by_rank(self) -> dict[int, dict[str, float]]:
        """Each rank's last reported value of each metric."""
        return last_by_rank(list(self.reported))


# --- A runner's options, checked once ----------------------------------------------------

LOG_MODES = ("all", "log_callback_only")
LAUNCHERS = ("auto", "mpi", "direct")
REPORT_RANKS = ("rank0", "all")


def seconds_or_off(text: str) -> float | None:
    """A `sparkdist run` flag's seconds, or "off" (None)."""
    if text.strip().lower() in ("off", "none"):
        return None
    value = float(text)
    if not value > 0:
        raise ValueError(f"expected a positive number of seconds or off, got {text}")
    return value


def _off_flag(help: str) -> dict[str, Any]:
    """A field of seconds that "off" (None) turns off; a sign of life is an output line,
    a `report()`, a loader batch, an elastic commit or a checkpoint."""
    return _flag(help + "; off: never", metavar="S", type=seconds_or_off)


def _flag(help: str, **keywords: Any) -> dict[str, Any]:
    """A field's metadata: the help of its `sparkdist run` flag, and `choices` (checked here
    too) or a `metavar`. The flag's name and how its text is parsed follow from the field's
    name and type (sparkdist/cli.py)."""
    return {"help": help, **keywords}


TRACE_HELP = (
    "write the job's trace: each rank's launch, steps, data waits, checkpoints, stalls, "
    "failures and world changes, in trace.json beside the rank logs (--no-trace: none)"
)


@dataclass(frozen=True)
class RunnerOptions:
    """See `HorovodRunner` for what each option means. Each field is also a flag of
    `sparkdist run`, built from the field: adding an option here adds the flag."""

    np: int = field(metadata=_flag("ranks: N > 0 on the cluster, N < 0 as -N processes here"))
    driver_log_verbosity: str = field(
        default="all",
        metadata=_flag(
            "all (default): every rank's output, prefixed with its rank; "
            "log_callback_only: only sparkdist.log_to_driver lines and errors",
            choices=LOG_MODES,
        ),
    )
    launcher: str = field(
        default="auto",
        metadata=_flag(
            "mpi: mpirun in the stage; direct: each task starts its ranks; "
            "auto (default): mpi when mpirun is installed (direct for an elastic job)",
            choices=LAUNCHERS,
        ),
    )
    start_timeout: float = field(
        default=600.0,
        metadata=_flag(
            "seconds for the job to get its slots and start every rank, and for an "
            "in-process elastic world below min_np to get them back (default 600)",
            metavar="S",
        ),
    )
    timeout: float | None = field(
        default=None,
        metadata=_flag("seconds for the whole job (default: no limit)", metavar="S"),
    )
    stall_warning: float | None = field(
        default=300.0,
        metadata=_off_flag("no sign of life for S seconds: log where each rank is (default 300)"),
    )
    stall_timeout: float | None = field(
        default=None,
        metadata=_off_flag(
            "no sign of life for S s: fail (in-process elastic: drop stopped ranks first; 60)"
        ),
    )
    env: Mapping[str, str] = field(
        default_factory=dict,
        metadata=_flag("an environment variable for the ranks (repeatable)", metavar="NAME=VALUE"),
    )
    mpi_args: tuple[str, ...] = field(
        default=(),
        metadata=_flag(
            'extra mpirun arguments as one string, e.g. "--mca btl_tcp_links 2"', metavar="ARGS"
        ),
    )
    network_interface: str | None = field(
        default=None,
        metadata=_flag(
            "the interface the ranks and sparkdist's channels use (e.g. eth0; "
            "default: the one carrying each executor's address)",
            metavar="IFACE",
        ),
    )
    timeline: str | None = field(
        default=None,
        metadata=_flag(
            "write a Horovod timeline of the job here (default: env HOROVOD_TIMELINE)",
            metavar="PATH",
        ),
    )
    trace: bool = field(default=True, metadata=_flag(TRACE_HELP, action=BooleanOptionalAction))
    max_failures: int | None = field(
        default=None,
        metadata=_flag(
            "relaunches after a lost executor or rank (default 0; no limit with --min-np/--max-np)"
        ),
    )
    """None (not given): no limit for an elastic job, 0 for a fixed-size one
    (`relaunch_limit`)."""
    retry_on_exception: bool = field(
        default=False, metadata=_flag("also relaunch when the script itself raised")
    )
    checkpoint_dir: str | None = field(
        default=None, metadata=_flag("where sparkdist.checkpoint keeps checkpoints")
    )
    checkpoint_keep: int = field(
        default=2,
        metadata=_flag("how many of the newest checkpoints are kept (default 2)", metavar="N"),
    )
    ranks_per_task: int = field(
        default=1,
        metadata=_flag(
            "ranks each Spark task starts; --np must be a multiple (default 1)", metavar="K"
        ),
    )
    roles: Roles | Mapping[str, int] | str | None = field(
        default=None,
        metadata=_flag(
            "a parameter-server job's roles, e.g. chief=1,worker=2,ps=1 (they add up to --np)"
        ),
    )
    min_np: int | None = field(
        default=None, metadata=_flag("elastic: start with at least this many ranks")
    )
    max_np: int | None = field(default=None, metadata=_flag("elastic: grow up to this many ranks"))
    report_ranks: str = field(
        default="rank0",
        metadata=_flag(
            "whose sparkdist.report metrics are shown and logged to MLflow (default rank0)",
            choices=REPORT_RANKS,
        ),
    )
    keep_warm: float | None = field(
        default=None,
        metadata=_off_flag(
            "seconds the ranks stay, idle, after a run, for this process's next run of the "
            "same shape (notebooks); default off"
        ),
    )

    def __post_init__(self) -> None:
        _check_np(self.np)
        _check_elastic(self.np, self.min_np, self.max_np, self.ranks_per_task, self.roles)
        roles = None if self.roles is None else Roles.parse(self.roles)
        if roles is not None:
            roles.check_ranks(abs(self.np))
        _check_ranks_per_task(self.ranks_per_task, self.np)
        for option in fields(self):
            choices = option.metadata.get("choices")
            value = getattr(self, option.name)
            if choices is not None and value not in choices:
                raise ValueError(f"{option.name} must be one of {choices}, got {value!r}")
        _check_launcher(self.launcher)
        _check_keep_warm(self.keep_warm, self.roles)
        _check_seconds(self)
        env = _checked_env(self.env)
        mpi_args = _checked_mpi_args(self.mpi_args)
        failures = self.max_failures
        if failures is not None and (
            isinstance(failures, bool) or not isinstance(failures, int) or failures < 0
        ):
            raise ValueError(
                f"max_failures must be an int >= 0 (relaunches allowed), got {failures!r}"
            )
        keep = self.checkpoint_keep
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(
                f"checkpoint_keep must be an int >= 1 (the newest checkpoints kept), got {keep!r}"
            )
        normalised = {
            "start_timeout": float(self.start_timeout),
            "env": env,
            "mpi_args": tuple(mpi_args),
            "retry_on_exception": bool(self.retry_on_exception),
            "timeline": _path(self.timeline),
            "checkpoint_dir": _path(self.checkpoint_dir),
            "roles": roles,
        }
        for name, value in normalised.items():
            object.__setattr__(self, name, value)

    @property
    def elastic(self) -> bool:
        """Whether the job's size may change (`min_np`/`max_np` given)."""
        return self.min_np is not None or self.max_np is not None

    @property
    def relaunch_limit(self) -> int | None:
        """How many relaunches failures outside `main` may cause; None for no limit.
        Not given, an elastic job relaunches without a cap (as Horovod's elastic
        `reset_limit`), bounded by min_np and start_timeout; a fixed-size job, never."""
        if self.max_failures is not None:
            return self.max_failures
        return None if self.elastic else 0

    @property
    def size_range(self) -> tuple[int, int]:
        """(min_np, max_np): each defaults to np, as in Horovod's elastic runner."""
        np = abs(self.np)
        return (
            np if self.min_np is None else self.min_np,
            np if self.max_np is None else self.max_np,
        )

    @property
    def num_ranks(self) -> int:
        """How many ranks the job has."""
        return abs(self.np)

    @property
    def on_driver(self) -> bool:
        """Whether the ranks run as subprocesses of the driver (`np < 0`)."""
        return self.np < 0

    def resolved_launcher(self) -> str:
        """ "mpi" or "direct": "auto" is mpi when mpirun is installed, except for an
        elastic job, whose world re-forms in process only under the direct launcher
        (mpirun ends every rank when one of its daemons is lost)."""
        if self.launcher != "auto":
            return self.launcher
        return "mpi" if mpirun_available() and not self.elastic else "direct"


def _check_np(np: int) -> None:
    if isinstance(np, bool) or not isinstance(np, int):
        raise ValueError(f"np must be an int, got {np!r}")
    if np == 0:
        raise ValueError(
            "np must not be 0: use np > 0 for that many ranks on the cluster, or np < 0 "
            "for -np ranks on the driver"
        )


def _check_seconds(options: RunnerOptions) -> None:
    for name in ("start_timeout", "timeout", "stall_warning", "stall_timeout", "keep_warm"):
        value = getattr(options, name)
        if value is not None and not value > 0:
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


def _checked_env(env: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(env or {})
    bad = [k for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise ValueError(f"env must map str to str; bad entries: {bad}")
    return env


def _checked_mpi_args(mpi_args) -> Any:
    if isinstance(mpi_args, str) or not all(isinstance(a, str) for a in mpi_args):
        raise ValueError("mpi_args must be a list of strings, e.g. ['--mca', 'btl_tcp_links', '2']")
    return mpi_args


def _check_keep_warm(keep_warm, roles) -> None:
    """A warm world is a world of ranks that all return from each run."""
    if keep_warm is None:
        return
    if roles is not None:
        raise ValueError(
            "keep_warm keeps ranks that each return from every run; a parameter-server "
            "job's servers never return: drop roles, or keep_warm"
        )


def _check_elastic(np: int, min_np, max_np, per_task: int, roles) -> None:
    """min_np/max_np: ints >= 1 around np, on the cluster, in whole tasks."""
    if min_np is None and max_np is None:
        return
    for name, value in (("min_np", min_np), ("max_np", max_np)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{name} must be an int, got {value!r}")
    if np < 0:
        raise ValueError(
            f"min_np/max_np make the job elastic on the cluster, but np={np} runs every rank "
            "on the driver: use np > 0"
        )
    low = np if min_np is None else min_np
    high = np if max_np is None else max_np
    if low < 1:
        raise ValueError(f"min_np must be at least 1, got {low}")
    if low > high:
        raise ValueError(f"min_np={low} is more than max_np={high}")
    if not low <= np <= high:
        raise ValueError(f"np={np} must lie between min_np={low} and max_np={high}")
    if low % per_task or high % per_task:
        raise ValueError(
            f"min_np={low} and max_np={high} must be multiples of ranks_per_task={per_task} "
            "(the job grows and shrinks by whole Spark tasks)"
        )
    if roles is not None:
        raise ValueError(
            "roles (a parameter-server job) cannot be combined with min_np/max_np: "
            "ParameterServerStrategy already tolerates lost workers"
        )


def _check_ranks_per_task(per_task: int, np: int) -> None:
    if isinstance(per_task, bool) or not isinstance(per_task, int) or per_task < 1:
        raise ValueError(f"ranks_per_task must be an int >= 1, got {per_task!r}")
    if per_task == 1:
        return
    if np < 0:
        raise ValueError(
            f"ranks_per_task={per_task} places ranks in Spark tasks, but np={np} runs every "
            "rank on the driver: use np > 0, or leave ranks_per_task at 1"
        )
    if np % per_task:
        raise ValueError(
            f"np={np} must be a multiple of ranks_per_task={per_task} (every Spark task "
            "starts the same number of ranks)"
        )


def _check_launcher(launcher: str) -> None:
    if launcher == "mpi" and not mpirun_available():
        raise ValueError(
            "launcher='mpi' needs Open MPI's mpirun on PATH: install it (e.g. "
            "`bash init_scripts/install_system.sh`) or use launcher='direct'"
        )


def _path(value: str | os.PathLike | None) -> str | None:
    return os.fspath(value) if value is not None else None
