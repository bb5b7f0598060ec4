"""MLflow glue for a search: the caller's active run is the search's parent run, and
every finished trial becomes a child run with its parameters, intermediate values and
final value. Without an active run (or without mlflow imported) nothing is logged."""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger(__name__)

_STATUS = {"COMPLETE": "FINISHED", "PRUNED": "KILLED", "FAIL": "FAILED"}


class SearchTracking:
    """Logs the trials of one search under the run active when the search started."""

    def __init__(self):
        self.parent = None
        if "mlflow" in sys.modules:
            import mlflow

            self.parent = mlflow.active_run()

    def log_trial(self, frozen) -> None:
        """One child run for a finished `optuna.trial.FrozenTrial`."""
        if self.parent is None:
            return
        from mlflow import MlflowClient
        from mlflow.entities import Metric, Param

        try:
            client = MlflowClient()
            run = client.create_run(
                self.parent.info.experiment_id,
                run_name=f"trial-{frozen.number}",
                tags={
                    "mlflow.parentRunId": self.parent.info.run_id,
                    "sparkdist.tune.trial": str(frozen.number),
                    "sparkdist.tune.state": frozen.state.name,
                },
            )
            now = int((frozen.datetime_complete or frozen.datetime_start).timestamp() * 1000)
            metrics = [
                Metric("intermediate_value", float(v), now, int(step))
                for step, v in sorted(frozen.intermediate_values.items())
            ]
            if frozen.values is not None:
                metrics += [
                    Metric("value" if i == 0 else f"value_{i}", float(v), now, 0)
                    for i, v in enumerate(frozen.values)
                ]
            client.log_batch(
                run.info.run_id,
                metrics=metrics,
                params=[Param(k, str(v)) for k, v in frozen.params.items()],
            )
            client.set_terminated(run.info.run_id, _STATUS.get(frozen.state.name, "FINISHED"))
        except Exception as error:  # noqa: BLE001 - tracking must not fail the search
            logger.warning(
                "sparkdist.tune: could not log trial %d to MLflow: %s", frozen.number, error
            )

    def log_search(self, study) -> None:
        """The best trial so far, on the parent run."""
        if self.parent is None:
            return
        from mlflow import MlflowClient

        try:
            best = study.best_trial
        except ValueError:  # no completed trial, or a multi-objective study
            return
        try:
            client = MlflowClient()
            client.log_metric(self.parent.info.run_id, "best_value", float(best.value))
            client.set_tag(self.parent.info.run_id, "sparkdist.tune.best_trial", str(best.number))
            for key, value in best.params.items():
                client.set_tag(self.parent.info.run_id, f"sparkdist.tune.best.{key}", str(value))
        except Exception as error:  # noqa: BLE001
            logger.warning("sparkdist.tune: could not log the search to MLflow: %s", error)
