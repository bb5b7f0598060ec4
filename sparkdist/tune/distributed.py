"""Distributed trials: the objective runs on `np` ranks as one runner job (its own
barrier stage, tag and secret); rank 0's return value is the trial's value. Several
trials run at once, each from its own driver thread."""

from __future__ import annotations

import logging
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from sparkdist.errors import SparkdistError
from sparkdist.runner.driver import metrics
from sparkdist.runner.driver.horovod_runner import HorovodRunner
from sparkdist.spark import job_tag, jobs
from sparkdist.tune import shared
from sparkdist.tune.executor import CANCEL_WAIT_S, TrialExecutor
from sparkdist.tune.ledger import Ledger
from sparkdist.tune.outcome import COMPLETE, FAILED, PRUNED, Outcome
from sparkdist.tune.remote_trial import RemoteTrial
from sparkdist.tune.service import TrialService

logger = logging.getLogger(__name__)


class _TrialMain:
    """What every rank of a trial's job runs: the objective, with the search's shared
    data reachable. Named as the objective, for the progress line and the Spark UI."""

    def __init__(self, objective):
        self.objective = objective
        self.__name__ = getattr(objective, "__name__", "objective")

    def __call__(self, trial: RemoteTrial, service: tuple):
        shared.serve_from(*service)
        try:
            return self.objective(trial)
        finally:
            trial.close()


class DistributedTrial:
    """One trial as a `HorovodRunner(np=np)` job run from a driver thread."""

    def __init__(
        self,
        cluster,
        objective,
        service: TrialService,
        trial: RemoteTrial,
        np: int,
        runner_options: dict,
        prune_check: metrics.PruneCheck,
    ):
        self.prune_check = prune_check
        self.cluster = cluster
        self.objective = objective
        self.trial = trial
        self.service = (service.address, service.secret)
        self.runner = HorovodRunner(np=np, **runner_options)

    def run(self, was_pruned) -> Outcome:
        try:
            with metrics.feeding(self.prune_check), jobs.purpose(f"tune trial {self.trial.number}"):
                value = self.runner.run(
                    _TrialMain(self.objective), trial=self.trial, service=self.service
                )
            return Outcome(COMPLETE, value)
        except SparkdistError as exc:
            # A rank raised optuna.TrialPruned (as Optuna users write it): the runner
            # has already stopped every rank of the job.
            text = getattr(exc, "traceback", None) or ""
            if "TrialPruned" in text or was_pruned(self.trial.number):
                return Outcome(PRUNED)
            return Outcome(FAILED, traceback=str(exc))

    def cancel(self) -> None:
        """Cancel the job's barrier stage; the runner then stops every rank."""
        job = self.runner.last_job
        if job is not None and job.job_id:
            self.cluster.cancel(job_tag(job.job_id))


class DistributedTrials(TrialExecutor):
    """Runs a search's distributed trials, `at_once` runner jobs at a time."""

    def __init__(
        self,
        cluster,
        objective,
        service: TrialService,
        ledger: Ledger,
        at_once: int,
        np: int,
        runner_options: dict,
        report_metric: str | None = None,
    ):
        super().__init__(cluster, objective, service, ledger, at_once)
        self.np = np
        self.runner_options = runner_options
        self.report_metric = report_metric
        self.running: dict[Future, DistributedTrial] = {}
        self.pool = ThreadPoolExecutor(at_once, thread_name_prefix="sparkdist-tune")

    def start(self) -> bool:
        """Submit trials until `at_once` run; True while any runs."""
        while len(self.running) < self.at_once:
            trial = self.ledger.next_trial()
            if trial is None:
                break
            remote = self.service.remote_trial(trial)
            check = ReportFeed(self.ledger, trial.number, self.report_metric)
            job = DistributedTrial(
                self.cluster,
                self.objective,
                self.service,
                remote,
                self.np,
                self.runner_options,
                check,
            )
            self.running[self.pool.submit(job.run, self.ledger.was_pruned)] = job
        return bool(self.running)

    def wait(self, timeout: float) -> None:
        done, _ = wait(list(self.running), timeout=timeout, return_when=FIRST_COMPLETED)
        for future in done:
            job = self.running.pop(future)
            self.ledger.finish(job.trial.number, _outcome(future))

    def close(self) -> None:
        self.pool.shutdown(wait=False)

    def cancel(self) -> None:
        """Cancel the running trials' jobs and wait for them to end."""
        for job in self.running.values():
            job.cancel()
        done, _ = wait(list(self.running), timeout=CANCEL_WAIT_S)
        for future in done:
            job = self.running.pop(future)
            outcome = _outcome(future)
            if outcome.state != FAILED:  # it ended before it was cancelled
                self.ledger.finish(job.trial.number, outcome)


class ReportFeed:
    """Feeds rank 0's `sparkdist.report` values of one trial to its pruner: the value of
    `metric` (or the only one reported) is `trial.report(value, step)`; True once
    `trial.should_prune()` says so."""

    def __init__(self, ledger: Ledger, number: int, metric: str | None):
        self.ledger, self.number, self.metric = ledger, number, metric
        self._warned = False

    def __call__(self, step: int, values: dict) -> bool:
        name = self.metric
        if name is None and len(values) == 1:
            name = next(iter(values))
        if name not in values:
            if not self._warned:
                logger.warning(
                    "sparkdist.tune: trial %d reported %s, which the pruner cannot use: pass "
                    "optimize(..., report_metric=NAME) to say which one it judges",
                    self.number,
                    sorted(values),
                )
                self._warned = True
            return False
        try:
            self.ledger.call(self.number, "report", (values[name], step), {})
            return bool(self.ledger.call(self.number, "should_prune", (), {}))
        except RuntimeError as exc:  # the trial already ended (cancelled)
            logger.debug("sparkdist.tune: report of trial %d not fed: %s", self.number, exc)
            return False


def _outcome(future: Future) -> Outcome:
    try:
        return future.result()
    except Exception as exc:  # noqa: BLE001 - the driver-side part of the trial failed
        return Outcome(FAILED, traceback=f"{type(exc).__name__}: {exc}")
