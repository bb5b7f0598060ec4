"""Distributed trials: the objective runs on `np` ranks as one runner job (its own
barrier stage, job group and secret); rank 0's return value is the trial's value."""

from __future__ import annotations

import logging

from sparkdist.runner import payload
from sparkdist.runner.errors import SparkdistError
from sparkdist.runner.horovod_runner import HorovodRunner
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

    def __init__(self, sc, objective, trial: RemoteTrial, np: int, runner_options: dict):
        payload.pack(objective, {"trial": trial})  # fails the search now if it cannot travel
        self.sc = sc
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
            self.sc.cancelJobGroup(f"sparkdist-{job.job_id}")
