"""Single-node trials: the objective runs as one Spark task, in its own job group so
that the driver can cancel it."""

from __future__ import annotations

import logging
import os
import sys

import cloudpickle

from sparkdist.runner.protocol import payload
from sparkdist.runner.protocol.payload import driver_pythonpath
from sparkdist.spark import spark_error_summary
from sparkdist.tune.outcome import FAILED, Outcome, run_objective
from sparkdist.tune.remote_trial import RemoteTrial

logger = logging.getLogger(__name__)


def _run_in_task(blob: bytes, import_path: str) -> Outcome:
    """In the Spark task: make the driver's modules importable (an objective defined in
    a module is pickled by reference, as the runner's ranks see it), then run it."""
    for entry in import_path.split(os.pathsep):
        if entry and entry not in sys.path and os.path.isdir(entry):
            sys.path.append(entry)
    objective, kwargs = cloudpickle.loads(blob)
    return run_objective(objective, kwargs["trial"])


class SingleNodeTrial:
    """One trial as a one-task Spark job."""

    def __init__(self, cluster, objective, trial: RemoteTrial, search_id: str):
        self.cluster = cluster
        # Pickled now, on the driver's main thread: an objective that cannot travel fails
        # the search at once with the name of the culprit (`PayloadError`).
        payload.pack(objective, {"trial": trial})
        self.objective = objective
        self.trial = trial
        self.number = trial.number
        self.group = f"sparkdist-tune-{search_id}-{trial.number}"

    def run(self) -> Outcome:
        # Pickled again in the thread that submits the job: pyspark ships the broadcast
        # variables the objective uses with the job pickled in the same thread.
        blob = cloudpickle.dumps((self.objective, {"trial": self.trial}))
        import_path = driver_pythonpath()

        def task(_index: int) -> bytes:
            return cloudpickle.dumps(_run_in_task(blob, import_path))

        try:
            (outcome,) = self.cluster.run_tasks(1, task, self.group)
            return cloudpickle.loads(outcome)
        except Exception as exc:  # noqa: BLE001 - a lost task or a cancelled job
            return Outcome(FAILED, traceback=f"the trial's Spark task failed: "
                           f"{spark_error_summary(exc)}")  # fmt: skip

    def cancel(self) -> None:
        self.cluster.cancel(self.group)
