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

from sparkdist.errors import SparkdistError
from sparkdist.protocol import payload
from sparkdist.spark import spark_error_summary
from sparkdist.tune.executor import CANCEL_WAIT_S, TrialExecutor
from sparkdist.tune.ledger import Ledger
from sparkdist.tune.service import LOST, TrialService
from sparkdist.tune.worker import run_worker

logger = logging.getLogger(__name__)


class SingleNodeTrials(TrialExecutor):
    """Runs a search's single-node trials on `workers` Spark tasks at a time."""

    poll_s = 0.25

    def __init__(self, cluster, objective, service: TrialService, ledger: Ledger, workers: int):
        super().__init__(cluster, objective, service, ledger, workers)
        self.tag = f"sparkdist-tune-{uuid.uuid4().hex[:8]}"
        # Set when the running job's thread ends. Not Thread.join: on Python < 3.13 a
        # join interrupted by Ctrl-C can mark the still-running thread as stopped.
        self._ended = threading.Event()
        self._ended.set()
        self._error: BaseException | None = None
        self._jobs = 0
        self._finished_before = 0  # trials finished when the running job started

    def start(self) -> bool:
        """A job runs until its workers find no trial left; after a job that failed
        while trials remain, a new one runs them, unless it finished none (its error
        then ends the search)."""
        if not self._ended.is_set():
            return True
        if self._jobs and not self._job_ended():
            return False
        if not self.ledger.can_start():
            return False
        self._finished_before = self.ledger.finished
        self._start_job(min(self.at_once, self.ledger.n_trials - self.ledger.started))
        return True

    def wait(self, timeout: float) -> None:
        self._ended.wait(timeout)

    def _job_ended(self) -> bool:
        """Record the ended job's trials; True when a new job should run the rest."""
        self.ledger.fail_running(LOST)
        self.ledger.check_failures()
        if self._error is None:
            return False
        summary = spark_error_summary(self._error)
        if self.ledger.finished == self._finished_before:
            raise SparkdistError(f"the Spark job running the trials failed: {summary}")
        logger.warning(
            "sparkdist.tune: the trials' Spark job failed (%s); a new job "
            "runs the remaining trials",
            summary,
        )
        return True

    def _start_job(self, workers: int) -> None:
        self._error = None
        self._jobs += 1
        self._ended.clear()
        threading.Thread(
            target=self._job, args=(workers,), name="sparkdist-tune-job", daemon=True
        ).start()

    def _job(self, workers: int) -> None:
        # Pickled in the thread that submits the job: pyspark ships the broadcast
        # variables the objective uses with the job pickled in the same thread.
        blob = payload.pack(self.objective, {})  # its tracebacks show its lines
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
