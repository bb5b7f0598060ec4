"""Distributed trials: the objective runs on `np` ranks as one runner job (its own
barrier stage, job group and secret); rank 0's return value is the trial's value."""

from __future__ import annotations

import logging

from sparkdist.errors import SparkdistError
from sparkdist.runner.driver.horovod_runner import HorovodRunner
from sparkdist.runner.protocol import payload
from sparkdist.spark import job_tag
from sparkdist.tune.outcome import COMPLETE, FAILED, PRUNED, Outcome
from sparkdist.tune.remote_trial import RemoteTrial

logger = logging.getLogger(__name__)


def _rank_main(objective, trial: RemoteTrial):
    try:
        return objective(trial)
    finally:
        trial.close()


class DistributedTrial:
    """One trial as a `HorovodRunner(np=np)` job run from a driver thread."""

    def __init__(self, cluster, objective, trial: RemoteTrial, np: int, runner_options: dict):
        payload.pack(objective, {"trial": trial})  # fails the search now if it cannot travel
        self.cluster = cluster
        self.objective = objective
        self.trial = trial
        self.runner = HorovodRunner(np=np, **runner_options)

    def run(self, was_pruned) -> Outcome:
        try:
            return Outcome(COMPLETE, self.runner.run(_rank_main, objective=self.objective,
                                                     trial=self.trial))  # fmt: skip
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
