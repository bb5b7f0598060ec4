"""sparkdist.tune on a runtime's stack: Optuna trials as long-lived Spark tasks, and a
distributed trial as a runner job."""

from __future__ import annotations

import os

import optuna

import sparkdist.tune

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_single_node_trials_run_in_spark_tasks(sc):
    def objective(trial):
        import os

        x = trial.suggest_float("x", -4.0, 4.0)
        trial.set_user_attr("pid", os.getpid())
        return (x - 1.0) ** 2

    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0))
    assert sparkdist.tune.optimize(study, objective, n_trials=4, parallelism=2) is study
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4
    assert all(t.user_attrs["pid"] != os.getpid() for t in study.trials)
    assert study.best_value == min(t.value for t in study.trials)


def test_distributed_trial_runs_on_two_ranks(sc):
    def objective(trial):
        import os

        x = trial.suggest_float("x", 0.0, 1.0)
        return x + int(os.environ["WORLD_SIZE"])

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    sparkdist.tune.optimize(study, objective, n_trials=1, np=2)
    (trial,) = study.trials
    assert trial.state.name == "COMPLETE"
    assert trial.value == trial.params["x"] + 2
