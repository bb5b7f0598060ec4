"""Parallel independent trials: a hyperparameter search whose trials run on the Spark
cluster, each as one Spark task (`np=None`) or as a runner job of `np` ranks.

Optuna holds the search on the driver (samplers, pruners, storage); the objective's
trial calls reach the driver's study through an authenticated channel.

    study = optuna.create_study(direction="minimize")
    sparkdist.tune.optimize(study, objective, n_trials=16, parallelism=4)
"""

from sparkdist.tune.remote_trial import RemoteTrial
from sparkdist.tune.search import TooManyFailedTrialsError, optimize

__all__ = ["RemoteTrial", "TooManyFailedTrialsError", "optimize"]
