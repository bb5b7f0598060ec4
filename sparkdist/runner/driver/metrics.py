"""Where the metrics that ranks send with `sparkdist.report` go on the driver.

One `ReportedMetrics` per `HorovodRunner.run` (across relaunches): it keeps every
report in arrival order (`JobReport.reported`, so `runner.last_job.metrics` has the last
values), shows the newest on a progress line, logs rank 0's (or every rank's) as MLflow
step metrics into the run active when `run` was called, and, inside a distributed
`sparkdist.tune` trial, feeds rank 0's to the trial's pruner and answers "prune" when it
says so.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

from sparkdist import progress, tracking

logger = logging.getLogger(__name__)

PruneCheck = Callable[[int, dict], bool]
"""A tune trial's hook: given rank 0's (step, metrics), whether to prune the trial."""


class Reported(NamedTuple):
    """One `sparkdist.report` call as the driver received it."""

    rank: int
    step: int
    metrics: dict
    time: float
    """When it arrived (seconds since the epoch)."""


_feeding = threading.local()


@contextlib.contextmanager
def feeding(check: PruneCheck) -> Iterator[None]:
    """Runner jobs started in this thread (a tune trial's) feed their reports to `check`."""
    _feeding.check = check
    try:
        yield
    finally:
        _feeding.check = None


class ReportedMetrics:
    """A job's reports: kept, and (when `live`, on the user's driver) shown, logged to
    MLflow and fed to a tune trial. Safe across the driver's handler threads."""

    def __init__(
        self,
        reported: list[Reported] | None = None,
        report_ranks: str = "rank0",
        live: bool = False,
        label: str = "sparkdist job",
    ):
        self.reported = reported if reported is not None else []
        self.report_ranks = report_ranks
        self.label = label
        self._lock = threading.Lock()
        self._pruned = False
        self._live = live
        self._prune_check: PruneCheck | None = getattr(_feeding, "check", None) if live else None
        self._mlflow = tracking.step_metrics() if live else None
        self._bar: progress.Bar | None = None

    def add(self, rank: int, step: int, metrics: dict, when: float | None = None) -> bool:
        """Record one report; True when the rank is to stop because its trial was pruned."""
        entry = Reported(rank, step, dict(metrics), time.time() if when is None else when)
        with self._lock:
            self.reported.append(entry)
            if not self._live:
                return False
            if rank == 0 or self.report_ranks == "all":
                self._show(entry)
                if self._mlflow is not None:
                    prefix = f"rank{rank}/" if self.report_ranks == "all" else ""
                    self._mlflow.log(entry.metrics, step, prefix)
            if rank == 0 and self._prune_check is not None and not self._pruned:
                self._pruned = self._prune_check(step, entry.metrics)
            return self._pruned

    def _show(self, entry: Reported) -> None:
        if self._bar is None:
            self._bar = progress.bar(None, self.label, unit="reports")
        shown = {"step": entry.step, **entry.metrics}
        if self.report_ranks == "all":
            shown = {"rank": entry.rank, **shown}
        self._bar.update(1, **shown)

    def straggling(self, ranks: list[int]) -> None:
        """Show the ranks named slow now on the progress line (none: "-")."""
        with self._lock:
            if self._bar is not None:
                self._bar.update(0, stragglers=",".join(map(str, ranks)) or "-")

    def close(self) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None


def last_by_rank(reported: list[Reported]) -> dict[int, dict]:
    """Each rank's newest values of each metric it reported."""
    last: dict[int, dict] = {}
    for entry in reported:
        last.setdefault(entry.rank, {}).update(entry.metrics)
    return last
