"""The one interface every path uses to run work on Spark, whatever the kind of session.

A classic session (a SparkContext in this process: `classic.ClassicSpark`) and a Spark
Connect client (`connect.ConnectSpark`) differ only in how stages are submitted,
tagged and cancelled, how slots are counted, and whether the executors can reach this
process. `active.active_cluster()` picks the right one for the active session; the kind
of a session (`is_connect_session`) is told here, below both implementations, so that
neither imports the other nor the module that chooses between them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from sparkdist.errors import ConnectUnsupportedError

BarrierTask = Callable[[Iterator], Iterator[bytes]]
"""One barrier task's part of a job; yields one value."""

PlainTask = Callable[[int], bytes]
"""One task of a plain job, given its index; returns one value."""


def job_tag(job_id: str) -> str:
    """The tag (job group) under which a runner job's stage runs, so it can be cancelled."""
    return f"sparkdist-{job_id}"


@dataclass(frozen=True)
class ServicePlace:
    """Where a job's service listens so that every task can reach it."""

    bind: str
    """The address the service binds to."""
    advertise: str
    """The address tasks connect to."""
    in_stage: bool = False
    """True when the executors cannot reach this process (a Spark Connect client behind
    a firewall): the service must run inside the stage, in its task 0."""


class Cluster(Protocol):
    """Everything sparkdist asks of Spark; one implementation per kind of session."""

    kind: str
    """"classic" (a SparkContext in this process) or "connect" (a Spark Connect client)."""

    def slots(self) -> int:
        """The task slots the cluster is configured to have (or, if unknown, has now)."""

    def check_slots(self, np: int, ranks_per_task: int, timeout_s: float) -> None:
        """Raise `NotEnoughSlotsError` (with both numbers) rather than hang, when the
        cluster cannot run np // ranks_per_task barrier tasks at once, and a clear error
        when dynamic allocation is on (Spark refuses barrier stages then)."""

    def check_elastic(self, max_np: int, ranks_per_task: int) -> None:
        """Raise `NotEnoughSlotsError` (with both numbers) when a fixed-size cluster can
        never hold an elastic job's max_np ranks."""

    def service_place(self) -> ServicePlace:
        """Where a job's service should listen (probing once whether executors reach
        this process, under Spark Connect)."""

    def run_barrier_stage(
        self,
        num_tasks: int,
        task: BarrierTask,
        tag: str,
        description: str = "",
        announce: Callable[[bytes], None] | None = None,
    ) -> list[bytes]:
        """Run `task` in `num_tasks` barrier tasks tagged `tag`, described in the Spark
        UI by `description` (`jobs.described`); block until the stage ends and return
        what each task yielded. `announce` (Spark Connect only: a relayed warm world's)
        is called with task 0's value as soon as task 0 ended, the others still running."""

    def run_tasks(
        self, num_tasks: int, task: PlainTask, tag: str, description: str = ""
    ) -> list[bytes]:
        """Run `task(i)` in `num_tasks` ordinary tasks (no gang scheduling) tagged `tag`
        and described by `description`; block until all ended and return their values
        in task order."""

    def cancel(self, tag: str) -> None:
        """Cancel the Spark jobs tagged `tag` (from any thread)."""


def spark_error_summary(exc: BaseException) -> str:
    """The Python error inside a Py4J/Spark error, instead of a Java stack."""
    python = python_error_in(exc)
    if python is not None:
        return python
    text = str(exc)
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first[:300]


def python_error_in(exc: BaseException) -> str | None:
    """The last Python exception line a Spark task raised, quoted in a Spark error."""
    found = re.findall(r"^\s*(\w+(?:Error|Exception): .+)$", str(exc), re.M)
    python = [line for line in found if not line.startswith(("org.", "java.", "py4j"))]
    return python[-1].strip() if python else None


def is_connect_session(session: Any) -> bool:
    """Whether `session` is a Spark Connect client session (no SparkContext here)."""
    return type(session).__module__.startswith("pyspark.sql.connect")


def require_classic(session: Any, what: str, alternative: str) -> None:
    """Raise `ConnectUnsupportedError` naming `what` and `alternative` on Connect."""
    if session is not None and is_connect_session(session):
        raise ConnectUnsupportedError(
            f"{what} needs a SparkContext (Spark's JVM in this process), which a Spark "
            f"Connect session does not have. {alternative}"
        )
