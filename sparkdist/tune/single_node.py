"""Single-node trials: one Spark job of `workers` long-lived tasks (`tune.worker`), each
pulling trial after trial from the driver's trial service, so a trial costs no Spark job
and its worker's imports and shared data stay loaded.

A lost task does not hang the search: its trial is recorded failed when its channel
closes, Spark's task retry starts a new worker that pulls the next trial, and if the job
itself fails while trials remain, a new job runs them (as long as jobs make progress).
"""

from __future__ import annotations

import json
import logging
import threading
import uuid

import cloudpickle

from sparkdist.errors import SparkdistError
from sparkdist.protocol import payload
from sparkdist.spark import spark_error_summary
from sparkdist.tune.ledger import Ledger
from sparkdist.tune.service import LOST, TrialService
from sparkdist.tune.worker import run_worker

logger = logging.getLogger(__name__)

POLL_S = 0.25
CANCEL_WAIT_S = 120.0


class SingleNodeTrials:
    """Runs a search's single-node trials on `workers` Spark tasks at a time."""

    def __init__(self, cluster, objective, service: TrialService, ledger: Ledger, workers: int):
        # Pickled now, on the driver's main thread: an objective that cannot travel fails
        # the search at once with the name of the culprit (`PayloadError`).
        payload.pack(objective, {})
        self.cluster = cluster
        self.objective = objective
        self.service = service
        self.ledger = ledger
        self.workers = workers
        self.tag = f"sparkdist-tune-{uuid.uuid4().hex[:8]}"
        # Set when the running job's thread ends. Not Thread.join: on Python < 3.13 a
        # join interrupted by Ctrl-C can mark the still-running thread as stopped.
        self._ended = threading.Event()
        self._ended.set()
        self._error: BaseException | None = None

    def run(self) -> None:
        """Run jobs until the search starts no more trials; a job that fails without
        finishing any trial ends the search with its error."""
        while self.ledger.can_start():
            finished = self.ledger.finished
            remaining = self.ledger.n_trials - self.ledger.started
            self._start_job(min(self.workers, remaining))
            while not self._ended.wait(POLL_S):
                self.ledger.check_failures()
            self.ledger.fail_running(LOST)
            self.ledger.check_failures()
            if self._error is None:
                return
            summary = spark_error_summary(self._error)
            if self.ledger.finished == finished:
                raise SparkdistError(f"the Spark job running the trials failed: {summary}")
            logger.warning("sparkdist.tune: the trials' Spark job failed (%s); a new job "
                           "runs the remaining trials", summary)  # fmt: skip

    def _start_job(self, workers: int) -> None:
        self._error = None
        self._ended.clear()
        threading.Thread(
            target=self._job, args=(workers,), name="sparkdist-tune-job", daemon=True
        ).start()

    def _job(self, workers: int) -> None:
        # Pickled in the thread that submits the job: pyspark ships the broadcast
        # variables the objective uses with the job pickled in the same thread.
        blob = cloudpickle.dumps(self.objective)
        address, secret = self.service.address, self.service.secret
        import_path = payload.driver_pythonpath()

        def task(index: int) -> bytes:
            return run_worker(index, blob, address, secret, import_path)

        try:
            what = f"sparkdist tune: {workers} single-node trial workers"
            for summary in self.cluster.run_tasks(workers, task, self.tag, what):
                logger.info("sparkdist.tune: worker %s", json.loads(summary))
        except BaseException as exc:  # noqa: BLE001 - reported by run() on the main thread
            self._error = exc
        finally:
            self._ended.set()

    def cancel(self) -> None:
        """Cancel the running job (its tasks, and so their trials) and wait for it."""
        if not self._ended.is_set():
            self.service.stop_workers()
            self.cluster.cancel(self.tag)
            self._ended.wait(CANCEL_WAIT_S)
