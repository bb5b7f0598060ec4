"""The driver's side of a search: check the arguments and the session, start the trial
service, run the trials (single-node workers or distributed runner jobs) and stop them
on the trial count, the time limit, too many failures or Ctrl-C."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import optuna

from sparkdist.errors import ConnectUnsupportedError, SparkdistError
from sparkdist.spark import active_cluster
from sparkdist.tune.distributed import DistributedTrials
from sparkdist.tune.executor import TrialExecutor
from sparkdist.tune.ledger import CANCELLED, Ledger, TooManyFailedTrialsError
from sparkdist.tune.service import TrialService
from sparkdist.tune.shared import check_objective
from sparkdist.tune.single_node import SingleNodeTrials

logger = logging.getLogger(__name__)

__all__ = ["TooManyFailedTrialsError", "optimize"]


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
    report_metric: str | None = None,
) -> optuna.Study:
    """Run `n_trials` trials of `objective` on the Spark cluster, several at once.

    Args:
        study: the Optuna study (sampler, pruner, storage are the study's).
        objective: `objective(trial)` returning the value(s) to optimise; `trial` has
            Optuna's `suggest_*`, `report`, `should_prune`, `set_user_attr`.
        n_trials: how many trials this call runs.
        parallelism: most trials at once; by default as many as the slots allow.
        np: None runs the trials in `parallelism` long-lived Spark tasks (one job),
            each running trial after trial; N runs every trial on N ranks (a
            `HorovodRunner(np=N)` job; rank 0's return value is the trial's value).
        timeout: seconds after which no new trial starts (running ones finish).
        max_failed_trials: raise `TooManyFailedTrialsError` once more trials failed.
        runner_options: extra `HorovodRunner` arguments for distributed trials
            (launcher "direct" unless given).
        report_metric: in distributed trials, which metric of rank 0's
            `sparkdist.report(...)` calls is the trial's intermediate value for the
            pruner (`trial.report(value, step)`); by default the only one reported. When
            the pruner prunes, `report` raises `optuna.TrialPruned` on the ranks.
    Returns the study. Ctrl-C cancels the running trials and returns what finished.
    """
    _check_args(n_trials, parallelism, np, timeout, max_failed_trials)
    if not callable(objective):
        raise ValueError(f"objective must be a function objective(trial), got {objective!r}")
    if np is None and runner_options:
        raise ValueError("runner_options apply to distributed trials only: pass np=N too")
    cluster = active_cluster("sparkdist.tune runs its trials on a Spark cluster")
    check_objective(objective, cluster.kind, np)
    at_once = _trials_at_once(cluster.slots(), np, parallelism, n_trials)
    place = cluster.service_place()
    _require_reachable_driver(place)
    ledger = Ledger(study, n_trials, timeout, max_failed_trials)
    service = TrialService(place.bind, place.advertise, ledger)
    try:
        trials = _executor(
            cluster, objective, service, ledger, at_once, np, runner_options, report_metric
        )
        _run(trials, ledger)
    finally:
        service.close()
    return study


def _trials_at_once(slots: int, np: int | None, parallelism: int | None, n_trials: int) -> int:
    """How many trials run at once: `parallelism`, or as many as the task slots allow."""
    per_trial = np or 1
    if per_trial > slots:
        raise SparkdistError(
            f"np={np} ranks per trial need {np} task slots at once, but this Spark has "
            f"{slots}. Lower np, or give the cluster more executors or cores."
        )
    at_once = min(parallelism or slots, slots // per_trial, n_trials)
    if parallelism and parallelism > at_once:
        logger.info(
            "sparkdist.tune: %d trials at once (%d slots, %d per trial), not %d",
            at_once,
            slots,
            per_trial,
            parallelism,
        )
    return at_once


def _require_reachable_driver(place) -> None:
    """Every trial calls the study held on the driver while it runs: refuse a Spark
    Connect client the executors cannot reach, saying where to run the search instead."""
    if place.in_stage:
        raise ConnectUnsupportedError(
            "sparkdist.tune: the executors cannot open connections to this Spark Connect "
            f"client (at {place.advertise}), and every trial calls the study held here "
            "while it runs (trial.suggest_*, report, should_prune). Run the search where "
            "the executors reach the driver: a notebook attached to the cluster, or a "
            "client on the cluster's network that accepts TCP connections from the "
            "executors (SPARKDIST_CONNECT_RELAY=never skips the reachability probe). "
            "HorovodRunner jobs do run from here (relay mode)."
        )


def _executor(
    cluster,
    objective,
    service: TrialService,
    ledger: Ledger,
    at_once: int,
    np: int | None,
    runner_options: dict[str, Any] | None,
    report_metric: str | None,
) -> TrialExecutor:
    """The search's trial executor: long-lived single-node workers (np None), or one
    runner job of np ranks per trial."""
    if np is None:
        return SingleNodeTrials(cluster, objective, service, ledger, at_once)
    # The direct launcher by default: trials start faster without mpirun, and
    # concurrent mpirun jobs on one host can collide ("orte_session_dir failed");
    # launcher="mpi" in runner_options for code that needs MPI.
    options = {"launcher": "direct", **(runner_options or {})}
    return DistributedTrials(
        cluster, objective, service, ledger, at_once, np, options, report_metric
    )


def _run(trials: TrialExecutor, ledger: Ledger) -> None:
    """Run the trials; on Ctrl-C or an error, cancel the running ones and record them
    failed ("cancelled"); log the search's best trial to MLflow either way."""
    try:
        trials.run()
    except KeyboardInterrupt:
        logger.warning(
            "sparkdist.tune: interrupted; cancelling %d running trials", len(ledger.running)
        )
    finally:
        ledger.stop()
        trials.cancel()
        ledger.fail_running(CANCELLED)
        ledger.close_progress()
        ledger.tracking.log_search(ledger.study)
