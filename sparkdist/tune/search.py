"""The driver's loop: ask the study for trials, run as many at once as the slots allow,
tell the study each outcome; stop on the trial count, the time limit, too many failures
or Ctrl-C."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import optuna
from optuna.trial import TrialState

from sparkdist.errors import SparkdistError
from sparkdist.spark import active_cluster
from sparkdist.tune.distributed import DistributedTrial
from sparkdist.tune.outcome import COMPLETE, FAILED, PRUNED, Outcome
from sparkdist.tune.service import TrialService
from sparkdist.tune.single_node import SingleNodeTrial
from sparkdist.tune.tracking import SearchTracking

logger = logging.getLogger(__name__)

CANCEL_WAIT_S = 120.0


class TooManyFailedTrialsError(SparkdistError):
    """More trials failed than `max_failed_trials` allows."""


def _check_args(n_trials, parallelism, np, timeout, max_failed_trials) -> None:
    def positive_int(name, value, allow_zero=False):
        low = 0 if allow_zero else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")

    positive_int("n_trials", n_trials)
    if parallelism is not None:
        positive_int("parallelism", parallelism)
    if np is not None:
        positive_int("np (ranks per trial; None for single-node trials)", np)
    if max_failed_trials is not None:
        positive_int("max_failed_trials", max_failed_trials, allow_zero=True)
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")


def optimize(
    study: optuna.Study,
    objective: Callable[[Any], Any],
    *,
    n_trials: int,
    parallelism: int | None = None,
    np: int | None = None,
    timeout: float | None = None,
    max_failed_trials: int | None = None,
    runner_options: dict[str, Any] | None = None,
) -> optuna.Study:
    """Run `n_trials` trials of `objective` on the Spark cluster, several at once.

    Args:
        study: the Optuna study (sampler, pruner, storage are the study's).
        objective: `objective(trial)` returning the value(s) to optimise; `trial` has
            Optuna's `suggest_*`, `report`, `should_prune`, `set_user_attr`.
        n_trials: how many trials this call runs.
        parallelism: most trials at once; by default as many as the slots allow.
        np: None runs every trial as one Spark task; N runs it on N ranks (a
            `HorovodRunner(np=N)` job; rank 0's return value is the trial's value).
        timeout: seconds after which no new trial starts (running ones finish).
        max_failed_trials: raise `TooManyFailedTrialsError` once more trials failed.
        runner_options: extra `HorovodRunner` arguments for distributed trials
            (launcher "direct" unless given).
    Returns the study. Ctrl-C cancels the running trials and returns what finished.
    """
    _check_args(n_trials, parallelism, np, timeout, max_failed_trials)
    if not callable(objective):
        raise ValueError(f"objective must be a function objective(trial), got {objective!r}")
    if np is None and runner_options:
        raise ValueError("runner_options apply to distributed trials only: pass np=N too")
    cluster = active_cluster("sparkdist.tune runs its trials on a Spark cluster")
    if cluster.kind != "classic":
        from sparkdist.errors import ConnectUnsupportedError

        raise ConnectUnsupportedError(
            "sparkdist.tune runs its trials through a SparkContext (job groups, "
            "defaultParallelism), which a Spark Connect session does not have: run the "
            "search from a classic session (a notebook on a dedicated cluster, spark-submit)."
        )
    slots = cluster.slots()
    per_trial = np or 1
    if per_trial > slots:
        raise SparkdistError(
            f"np={np} ranks per trial need {np} task slots at once, but this Spark has "
            f"{slots}. Lower np, or give the cluster more executors or cores."
        )
    at_once = min(parallelism or slots, slots // per_trial, n_trials)
    if parallelism and parallelism > at_once:
        logger.info("sparkdist.tune: %d trials at once (%d slots, %d per trial), not %d",
                    at_once, slots, per_trial, parallelism)  # fmt: skip
    # The direct launcher by default: trials start faster without mpirun, and concurrent
    # mpirun jobs on one host can collide ("orte_session_dir failed"); launcher="mpi"
    # in runner_options for code that needs MPI.
    runner_options = {"launcher": "direct", **(runner_options or {})}
    place = cluster.service_place()
    service = TrialService(place.bind, place.advertise)
    search = _Search(study, objective, cluster, service, np, runner_options)
    try:
        search.run(n_trials, at_once, timeout, max_failed_trials)
    finally:
        service.close()
    return study


class _Search:
    def __init__(self, study, objective, cluster, service, np, runner_options):
        self.study = study
        self.objective = objective
        self.cluster = cluster
        self.service = service
        self.np = np
        self.runner_options = runner_options
        self.search_id = uuid.uuid4().hex[:8]
        self.tracking = SearchTracking()
        self.running: dict[Future, tuple[optuna.Trial, Any]] = {}
        self.failed = 0

    def _start(self, pool: ThreadPoolExecutor) -> None:
        trial = self.study.ask()
        remote = self.service.add(trial)
        try:
            if self.np is None:
                job = SingleNodeTrial(self.cluster, self.objective, remote, self.search_id)
                future = pool.submit(job.run)
            else:
                job = DistributedTrial(
                    self.cluster, self.objective, remote, self.np, self.runner_options
                )
                future = pool.submit(job.run, self.service.was_pruned)
        except BaseException as exc:  # e.g. PayloadError: no trial can run; stop the search
            self.service.remove(trial.number)
            trial.set_user_attr("traceback", f"{type(exc).__name__}: {exc}")
            self.study.tell(trial, state=TrialState.FAIL)
            raise
        self.running[future] = (trial, job)
        logger.info("sparkdist.tune: trial %d started", trial.number)

    def _finish(self, future: Future) -> None:
        trial, _ = self.running.pop(future)
        self.service.remove(trial.number)
        self._tell(trial, _outcome(future))

    def _tell(self, trial: optuna.Trial, outcome: Outcome) -> None:
        state = {COMPLETE: TrialState.COMPLETE, PRUNED: TrialState.PRUNED}.get(outcome.state)
        if state is TrialState.COMPLETE:
            try:
                frozen = self.study.tell(trial, outcome.value)
            except (ValueError, TypeError) as exc:
                outcome = Outcome(FAILED, traceback=f"the objective returned {outcome.value!r}: "
                                  f"{exc}")  # fmt: skip
                state = None
            else:
                logger.info("sparkdist.tune: trial %d finished with value %s",
                            trial.number, outcome.value)  # fmt: skip
        if state is TrialState.PRUNED:
            frozen = self.study.tell(trial, state=TrialState.PRUNED)
            logger.info("sparkdist.tune: trial %d pruned", trial.number)
        elif state is None:
            self.failed += 1
            trial.set_user_attr("traceback", outcome.traceback)
            frozen = self.study.tell(trial, state=TrialState.FAIL)
            logger.warning("sparkdist.tune: trial %d failed:\n%s", trial.number, outcome.traceback)
        self.tracking.log_trial(frozen)

    def run(self, n_trials, at_once, timeout, max_failed_trials) -> None:
        started = time.monotonic()
        launched = 0
        pool = ThreadPoolExecutor(at_once, thread_name_prefix="sparkdist-tune")
        try:
            while True:
                in_time = timeout is None or time.monotonic() - started < timeout
                while in_time and launched < n_trials and len(self.running) < at_once:
                    self._start(pool)
                    launched += 1
                if not self.running:
                    break
                done, _ = wait(list(self.running), timeout=0.5, return_when=FIRST_COMPLETED)
                for future in done:
                    self._finish(future)
                if max_failed_trials is not None and self.failed > max_failed_trials:
                    last = self.study.get_trials(deepcopy=False, states=(TrialState.FAIL,))[-1]
                    raise TooManyFailedTrialsError(
                        f"{self.failed} trials failed, more than max_failed_trials="
                        f"{max_failed_trials}; the search stopped. Last failure (trial "
                        f"{last.number}):\n{last.user_attrs.get('traceback')}"
                    )
        except KeyboardInterrupt:
            logger.warning("sparkdist.tune: interrupted; cancelling %d running trials",
                           len(self.running))  # fmt: skip
        finally:
            self._cancel_running()
            pool.shutdown(wait=False)
            self.tracking.log_search(self.study)

    def _cancel_running(self) -> None:
        """Cancel the running trials' Spark jobs, wait for them to end, record them failed."""
        if not self.running:
            return
        for _trial, job in self.running.values():
            job.cancel()
        done, _ = wait(list(self.running), timeout=CANCEL_WAIT_S)
        for future in list(self.running):
            trial, _ = self.running.pop(future)
            self.service.remove(trial.number)
            outcome = _outcome(future) if future in done else Outcome(FAILED)
            if outcome.state == FAILED:
                why = "cancelled: the search stopped while the trial ran"
                outcome = Outcome(FAILED, traceback=f"{why}\n{outcome.traceback or ''}".strip())
            self._tell(trial, outcome)


def _outcome(future: Future) -> Outcome:
    try:
        return future.result()
    except Exception as exc:  # noqa: BLE001 - the driver-side part of the trial failed
        return Outcome(FAILED, traceback=f"{type(exc).__name__}: {exc}")
