"""Parallel independent trials: a hyperparameter search whose trials run on the Spark
cluster, single-node (long-lived Spark tasks, each running trial after trial) or as
runner jobs of `np` ranks, from a classic or a Spark Connect session.

Optuna holds the search on the driver (samplers, pruners, storage); the objective's
trial calls reach the driver's study through an authenticated channel, and so do reads
of data shared with `share`.

    data = sparkdist.tune.share((x_train, y_train))
    study = optuna.create_study(direction="minimize")
    sparkdist.tune.optimize(study, objective, n_trials=16, parallelism=4)
"""

from sparkdist.tune.remote_trial import RemoteTrial
from sparkdist.tune.search import TooManyFailedTrialsError, optimize
from sparkdist.tune.shared import Shared, share

__all__ = ["RemoteTrial", "Shared", "TooManyFailedTrialsError", "optimize", "share"]
