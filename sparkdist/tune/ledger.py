"""The driver's record of one search: it asks the study for trials within the search's
budget (`n_trials`, `timeout`, `max_failed_trials`), carries out the running trials'
calls, tells the study each outcome and logs the finished trial to MLflow.

One lock covers all of it: the trial service's threads (workers asking for trials,
remote trials' calls) and the driver's loop all go through it, so the study sees ask,
suggest, report and tell in one order.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import optuna
from optuna.trial import TrialState

from sparkdist import progress
from sparkdist.errors import SparkdistError
from sparkdist.tune.outcome import COMPLETE, FAILED, PRUNED, Outcome
from sparkdist.tune.shared import hint_for
from sparkdist.tune.tracking import SearchTracking

logger = logging.getLogger(__name__)

TRIAL_OPS = frozenset(
    {
        "suggest_float",
        "suggest_int",
        "suggest_categorical",
        "report",
        "should_prune",
        "set_user_attr",
    }
)
CANCELLED = "cancelled: the search stopped while the trial ran"


class TooManyFailedTrialsError(SparkdistError):
    """More trials failed than `max_failed_trials` allows."""


class Ledger:
    """The running trials of one search and what the search may still start."""

    def __init__(
        self,
        study: optuna.Study,
        n_trials: int,
        timeout: float | None,
        max_failed_trials: int | None,
    ):
        self.lock = threading.RLock()
        self.study = study
        self.n_trials = n_trials
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.max_failed_trials = max_failed_trials
        self.tracking = SearchTracking()
        self.running: dict[int, optuna.Trial] = {}
        self.pruned: set[int] = set()
        self.started = 0
        self.finished = 0
        self.failed = 0
        self.stopping = False
        """Set when the search is being stopped: no trial starts, a lost one was cancelled."""
        self.progress = progress.bar(n_trials, "sparkdist tune", unit="trial")

    def can_start(self) -> bool:
        """Whether another trial may start (count, time, failures, not stopping)."""
        with self.lock:
            in_time = self.deadline is None or time.monotonic() < self.deadline
            too_many = self.max_failed_trials is not None and self.failed > self.max_failed_trials
            return not self.stopping and not too_many and in_time and self.started < self.n_trials

    def next_trial(self) -> optuna.Trial | None:
        """A new trial of the study, now running; None when the search starts no more."""
        with self.lock:
            if not self.can_start():
                return None
            trial = self.study.ask()
            self.started += 1
            self.running[trial.number] = trial
            logger.info("sparkdist.tune: trial %d started", trial.number)
            return trial

    def call(self, number: int, op: str, args: tuple, kwargs: dict) -> Any:
        """Carry out a remote trial's call on the running trial `number`."""
        with self.lock:
            trial = self.running.get(number)
            if trial is None or op not in TRIAL_OPS:
                what = f"trial {number} is not running" if trial is None else f"no call {op!r}"
                raise RuntimeError(f"sparkdist.tune: {what}")
            value = getattr(trial, op)(*args, **kwargs)
            if op == "should_prune" and value:
                self.pruned.add(number)
            return value

    def was_pruned(self, number: int) -> bool:
        """Whether the pruner told this trial to stop."""
        with self.lock:
            return number in self.pruned

    def finish(self, number: int, outcome: Outcome) -> None:
        """Tell the study how a running trial ended (a trial already told is left alone)."""
        with self.lock:
            trial = self.running.pop(number, None)
            if trial is None:
                return
            self.finished += 1
            frozen = self._tell(trial, outcome)
            self.progress.update(1, **self._best())
        self.tracking.log_trial(frozen)

    def lose(self, number: int, why: str) -> None:
        """A running trial's process ended before it reported: the trial failed."""
        with self.lock:
            reason = CANCELLED if self.stopping else why
        self.finish(number, Outcome(FAILED, traceback=reason))

    def stop(self) -> None:
        """Start no more trials; trials lost from now on were cancelled."""
        with self.lock:
            self.stopping = True

    def close_progress(self) -> None:
        self.progress.close()

    def _best(self) -> dict:
        """The best value so far, for the progress display (single-objective studies)."""
        if len(self.study.directions) != 1:
            return {}
        try:
            return {"best": self.study.best_value}
        except ValueError:  # no trial completed yet
            return {}

    def fail_running(self, why: str) -> None:
        """Record every trial still running failed (their processes are gone)."""
        with self.lock:
            numbers = list(self.running)
        for number in numbers:
            self.lose(number, why)

    def check_failures(self) -> None:
        """Raise `TooManyFailedTrialsError` once more trials failed than allowed."""
        with self.lock:
            if self.max_failed_trials is None or self.failed <= self.max_failed_trials:
                return
            last = self.study.get_trials(deepcopy=False, states=(TrialState.FAIL,))[-1]
        raise TooManyFailedTrialsError(
            f"{self.failed} trials failed, more than max_failed_trials="
            f"{self.max_failed_trials}; the search stopped. Last failure (trial "
            f"{last.number}):\n{last.user_attrs.get('traceback')}"
        )

    def _tell(self, trial: optuna.Trial, outcome: Outcome):
        state = {COMPLETE: TrialState.COMPLETE, PRUNED: TrialState.PRUNED}.get(outcome.state)
        if state is TrialState.COMPLETE:
            try:
                frozen = self.study.tell(trial, outcome.value)
            except (ValueError, TypeError) as exc:
                outcome = Outcome(
                    FAILED, traceback=f"the objective returned {outcome.value!r}: {exc}"
                )
                state = None
            else:
                logger.info(
                    "sparkdist.tune: trial %d finished with value %s", trial.number, outcome.value
                )
        if state is TrialState.PRUNED:
            frozen = self.study.tell(trial, state=TrialState.PRUNED)
            logger.info("sparkdist.tune: trial %d pruned", trial.number)
        elif state is None:
            self.failed += 1
            text = hint_for(outcome.traceback)
            trial.set_user_attr("traceback", text)
            frozen = self.study.tell(trial, state=TrialState.FAIL)
            logger.warning("sparkdist.tune: trial %d failed:\n%s", trial.number, text)
        return frozen
