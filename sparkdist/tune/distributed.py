"""Distributed trials: the objective runs on `np` ranks as one runner job (its own
barrier stage, tag and secret); rank 0's return value is the trial's value. Several
trials run at once, each from its own driver thread."""

from __future__ import annotations

import logging
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from sparkdist.errors import SparkdistError
from sparkdist.runner.driver.horovod_runner import HorovodRunner
from sparkdist.runner.protocol import payload
from sparkdist.spark import job_tag
from sparkdist.tune import shared
from sparkdist.tune.ledger import Ledger
from sparkdist.tune.outcome import COMPLETE, FAILED, PRUNED, Outcome
from sparkdist.tune.remote_trial import RemoteTrial
from sparkdist.tune.service import TrialService

logger = logging.getLogger(__name__)

POLL_S = 0.5
CANCEL_WAIT_S = 120.0


def _rank_main(objective, trial: RemoteTrial, service: tuple):
    shared.serve_from(*service)
    try:
        return objective(trial)
    finally:
        trial.close()


class DistributedTrial:
    """One trial as a `HorovodRunner(np=np)` job run from a driver thread."""

    def __init__(self, cluster, objective, service: TrialService, trial: RemoteTrial, np: int,
                 runner_options: dict):  # fmt: skip
        self.cluster = cluster
        self.objective = objective
        self.trial = trial
        self.service = (service.address, service.secret)
        self.runner = HorovodRunner(np=np, **runner_options)

    def run(self, was_pruned) -> Outcome:
        try:
            value = self.runner.run(_rank_main, objective=self.objective, trial=self.trial,
                                    service=self.service)  # fmt: skip
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


class DistributedTrials:
    """Runs a search's distributed trials, `at_once` runner jobs at a time."""

    def __init__(self, cluster, objective, service: TrialService, ledger: Ledger, at_once: int,
                 np: int, runner_options: dict):  # fmt: skip
        # Checked now: an objective that cannot travel fails the search at once.
        payload.pack(objective, {})
        self.cluster = cluster
        self.objective = objective
        self.service = service
        self.ledger = ledger
        self.np = np
        self.runner_options = runner_options
        self.running: dict[Future, DistributedTrial] = {}
        self.pool = ThreadPoolExecutor(at_once, thread_name_prefix="sparkdist-tune")
        self.at_once = at_once

    def run(self) -> None:
        try:
            while True:
                while len(self.running) < self.at_once:
                    trial = self.ledger.next_trial()
                    if trial is None:
                        break
                    remote = self.service.remote_trial(trial)
                    job = DistributedTrial(self.cluster, self.objective, self.service, remote,
                                           self.np, self.runner_options)  # fmt: skip
                    self.running[self.pool.submit(job.run, self.ledger.was_pruned)] = job
                if not self.running:
                    return
                done, _ = wait(list(self.running), timeout=POLL_S, return_when=FIRST_COMPLETED)
                for future in done:
                    job = self.running.pop(future)
                    self.ledger.finish(job.trial.number, _outcome(future))
                self.ledger.check_failures()
        finally:
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


def _outcome(future: Future) -> Outcome:
    try:
        return future.result()
    except Exception as exc:  # noqa: BLE001 - the driver-side part of the trial failed
        return Outcome(FAILED, traceback=f"{type(exc).__name__}: {exc}")
