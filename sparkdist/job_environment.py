"""The environment contract of a job's processes: every `SPARKDIST_*` variable that the
launch side (the driver's launch or a Spark task) writes for what it starts, and that
the supervisor, the rank, mpirun's rsh agent and the backends read, and the switches a
user sets in the environment for sparkdist.

Names and defaults are declared here once, and nowhere else in the package;
`TaskEnvironment` and `DirectRank` convert to and from the environment. The secret
travels here, never on a command line, and each reader takes it out of its own
environment (`take_secret`) so user code never sees it. This module imports nothing of
sparkdist: every layer may read it.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Protocol

# What every process a task starts for the job gets (`TaskEnvironment`).
JOB_ID = "SPARKDIST_JOB_ID"
DRIVER = "SPARKDIST_DRIVER"
"""host:port of the job's service (the driver's, or barrier task 0's in relay mode)."""
SECRET = "SPARKDIST_SECRET"
TASK_HOST = "SPARKDIST_TASK_HOST"
"""The address of the task's host that every other task can reach."""
NODE_RANK = "SPARKDIST_NODE_RANK"
NUM_NODES = "SPARKDIST_NUM_NODES"
LOG_MODE = "SPARKDIST_LOG_MODE"
LAUNCHER = "SPARKDIST_LAUNCHER"
# A rank's place under the direct launcher (under mpirun, Open MPI's OMPI_COMM_WORLD_*).
RANK = "SPARKDIST_RANK"
WORLD_SIZE = "SPARKDIST_WORLD_SIZE"
LOCAL_RANK = "SPARKDIST_LOCAL_RANK"
LOCAL_WORLD_SIZE = "SPARKDIST_LOCAL_WORLD_SIZE"
# Set for some processes only.
RSH_RELAY = "SPARKDIST_RSH_RELAY"
"""mpirun's: the Unix socket of task 0's launch relay, for the rsh agent."""
RSH_TOKEN = "SPARKDIST_RSH_TOKEN"
"""mpirun's: the random token the rsh agent shows task 0's launch relay."""
SUPERVISOR_PID = "SPARKDIST_SUPERVISOR_PID"
"""A rank's: its supervisor, whose death ends the rank."""
TASK_GPUS = "SPARKDIST_TASK_GPUS"
"""The GPU addresses Spark gave the task (or the driver's, for np < 0)."""
GPUS_PER = "SPARKDIST_GPUS_PER"
""""rank" (default): the ranks of a task split its GPUs, each sees its own share;
"task": each rank sees all of its task's GPUs and picks one by LOCAL_RANK, as under
torchrun (what TorchDistributor code expects)."""
ATTEMPT = "SPARKDIST_ATTEMPT"
"""0 for a job's first launch, 1 for its first relaunch, ..."""
HOROVOD_TIMELINE = "SPARKDIST_HOROVOD_TIMELINE"
"""The driver-side path of a Horovod timeline the job records."""
ROLES = "SPARKDIST_ROLES"
"""A parameter-server job's roles (`sparkdist.roles.Roles`), as role:count,..."""
STACKS = "SPARKDIST_STACKS"
"""A rank's: the directory where its supervisor asks it for its stacks
(`protocol/stack_dumps.py`: the faulthandler file, the NCCL trace request and dump)."""
LEFT_STACKS = "SPARKDIST_LEFT_STACKS"
"""A relayed job's supervisors': where a supervisor cut off from its task leaves its
rank's stacks before stopping it (`protocol/left_stacks.py`)."""
# torch's, set for the ranks unless the user set them.
NCCL_TRACE_BUFFER = "TORCH_FR_BUFFER_SIZE"
"""How many of its last collectives each rank's NCCL flight recorder keeps (torch 2.9+;
the older name below is still read, and a user's setting of either wins)."""
NCCL_TRACE_BUFFER_OLD = "TORCH_NCCL_TRACE_BUFFER_SIZE"
NCCL_TRACE_BUFFER_DEFAULT = "2000"
# Switches a user sets.
CONNECT_RELAY = "SPARKDIST_CONNECT_RELAY"
"""On a Spark Connect client: auto (probe once per session whether executors reach this
client), always (relay mode, no probe), never (no probe)."""
KERAS_MULTIWORKER_FIX = "SPARKDIST_KERAS_MULTIWORKER_FIX"
"""0 leaves Keras' MultiWorkerMirroredStrategy untouched (`backends/keras_compat.py`)."""
DEVICE_FEED = "SPARKDIST_DEVICE_FEED"
"""How a torch loader's ``device=`` moves its chunks: auto (time both ways on the first
chunks, keep the faster), ring (page-locked slots, one copy a chunk) or plain (``.to()``
a column; `sparkdist/data/rank/device_feed.py`)."""
TLS = "SPARKDIST_TLS"
"""0 in the driver's environment turns TLS off on the job's channels (benchmarks only)."""
CHECKPOINT_DRIVER_LIMIT_MB = "SPARKDIST_CHECKPOINT_DRIVER_LIMIT_MB"
"""The largest state (MiB) `checkpoint.save` sends through the driver (default 512)."""
PROGRESS = "SPARKDIST_PROGRESS"
"""0 turns sparkdist's progress displays off (`sparkdist.progress`)."""
LOG_LEVEL = "SPARKDIST_LOG_LEVEL"
"""The `sparkdist` logger's level where the application configured none (`console_log`)."""
ELASTIC_TIMEOUT_S = "SPARKDIST_ELASTIC_TIMEOUT_S"
"""`sparkdist.elastic.run`: seconds a process group may take to form and a collective to
finish before a rank gives up on its world (default 30)."""
ELASTIC_REFORM_LIMIT = "SPARKDIST_ELASTIC_REFORM_LIMIT"
"""`sparkdist.elastic.run`: how many times in a row a world may break and re-form of the
same members with no commit between (default 10); the next such break fails the rank
(`elastic.WorldStuck`)."""
ELASTIC_BACKEND = "SPARKDIST_ELASTIC_BACKEND"
"""`sparkdist.elastic.run`'s process group backend: "nccl" or "gloo" (default: NCCL when
the rank has a GPU, else gloo; gloo lets several ranks share one GPU)."""
PY_SPY = "SPARKDIST_PY_SPY"
"""py-spy's path, for the stacks of a rank that cannot give its own (a stopped one) in its
dump (`stack_dumps.find_py_spy`); "off" or "0": none; unset: `py-spy` on PATH, else
beside the supervisor's Python."""
PY_SPY_OFF = ("off", "0")
PY_SPY_NATIVE = "SPARKDIST_PY_SPY_NATIVE"
""""1": py-spy adds every rank's native stacks (gloo, NCCL frames: `py-spy dump
--native`) to each of its dumps; it then holds 100-330 MiB of the host's memory while it
reads libtorch's symbols. Unset: py-spy reads only a rank that gave no stacks itself, and
only its Python frames (about 8 MiB)."""

DEFAULT_LAUNCHER = "direct"
DEFAULT_LOG_MODE = "all"


class Secret(Protocol):
    """A job's secret as this module needs it (`protocol.job_secret.JobSecret`)."""

    def to_text(self) -> str: ...


@dataclass(frozen=True)
class JobEnvironment:
    """What every process of a job shares, wherever it runs."""

    job_id: str
    driver: str
    secret: Secret = field(repr=False)
    log_mode: str = DEFAULT_LOG_MODE
    launcher: str = DEFAULT_LAUNCHER


@dataclass(frozen=True)
class TaskEnvironment:
    """The job's variables in everything one task starts (and so in its ranks)."""

    job: JobEnvironment
    task_host: str
    node_rank: int = 0
    num_nodes: int = 1

    def to_env(self) -> dict[str, str]:
        job = self.job
        return {
            JOB_ID: job.job_id,
            DRIVER: job.driver,
            SECRET: job.secret.to_text(),  # HMAC key and certificate pin, no private key
            LOG_MODE: job.log_mode,
            LAUNCHER: job.launcher,
            TASK_HOST: self.task_host,
            NODE_RANK: str(self.node_rank),
            NUM_NODES: str(self.num_nodes),
        }

    @classmethod
    def from_env(cls, env: Mapping[str, str], secret: Secret, host: str) -> TaskEnvironment:
        """Read back; `secret` as taken out with `take_secret`, `host` the fallback
        for a process started outside a task (this host's name)."""
        job = JobEnvironment(
            job_id=env.get(JOB_ID, ""),
            driver=env[DRIVER],
            secret=secret,
            log_mode=env.get(LOG_MODE, DEFAULT_LOG_MODE),
            launcher=env.get(LAUNCHER, DEFAULT_LAUNCHER),
        )
        return cls(
            job=job,
            task_host=env.get(TASK_HOST, host),
            node_rank=int(env.get(NODE_RANK, "0")),
            num_nodes=int(env.get(NUM_NODES, "1")),
        )


def take_secret(env: MutableMapping[str, str]) -> str:
    """The job's secret in text form (the client form: enough to connect), removed from
    `env`; `JobSecret.from_text` reads it."""
    return env.pop(SECRET)


@dataclass(frozen=True)
class DirectRank:
    """A rank's place as the direct launcher gives it to the rank's supervisor."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    def to_env(self) -> dict[str, str]:
        return {
            RANK: str(self.rank),
            WORLD_SIZE: str(self.world_size),
            LOCAL_RANK: str(self.local_rank),
            LOCAL_WORLD_SIZE: str(self.local_world_size),
        }


def rank_layout(env: Mapping[str, str]) -> dict[str, str]:
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK for this rank.

    Under mpirun they come from Open MPI; under the direct launcher from `DirectRank`.
    """
    if "OMPI_COMM_WORLD_RANK" in env:
        return {
            "RANK": env["OMPI_COMM_WORLD_RANK"],
            "WORLD_SIZE": env["OMPI_COMM_WORLD_SIZE"],
            "LOCAL_RANK": env["OMPI_COMM_WORLD_LOCAL_RANK"],
            "LOCAL_WORLD_SIZE": env["OMPI_COMM_WORLD_LOCAL_SIZE"],
            "NODE_RANK": env.get(NODE_RANK, env.get("OMPI_COMM_WORLD_NODE_RANK", "0")),
        }
    return {
        "RANK": env[RANK],
        "WORLD_SIZE": env[WORLD_SIZE],
        "LOCAL_RANK": env[LOCAL_RANK],
        "LOCAL_WORLD_SIZE": env[LOCAL_WORLD_SIZE],
        "NODE_RANK": env.get(NODE_RANK, "0"),
    }


def gpus_to_env(addresses: list[str]) -> dict[str, str]:
    return {TASK_GPUS: ",".join(addresses)} if addresses else {}


def gpus_shared_by_task(env: Mapping[str, str]) -> bool:
    value = env.get(GPUS_PER, "rank")
    if value not in ("rank", "task"):
        raise ValueError(f'{GPUS_PER} must be "rank" or "task", not {value!r}')
    return value == "task"


def task_gpus(env: Mapping[str, str]) -> list[str]:
    return [a.strip() for a in env.get(TASK_GPUS, "").split(",") if a.strip()]


def attempt(env: Mapping[str, str]) -> int:
    return int(env.get(ATTEMPT, "0"))
