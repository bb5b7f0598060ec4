"""Driver side: hand the active MLflow run to the ranks, record each job in it.

Nothing here imports mlflow unless the user already did: without an import there can be
no active run, so users who do not track pay nothing.
"""

from __future__ import annotations

import logging
import os
import sys
import time

from sparkdist.tracking.uris import absolute_tracking_uri, default_tracking_uri, redact_uri

logger = logging.getLogger(__name__)

# Credentials the tracking client or the artifact store may need on rank 0. Their values
# reach rank 0 only, with its welcome over the job's encrypted channel (not through the
# Spark task or any other rank's environment), and are never logged.
CREDENTIAL_ENV_VARS = (
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_INSECURE_TLS",
    "MLFLOW_TRACKING_SERVER_CERT_PATH",
    "MLFLOW_TRACKING_CLIENT_CERT_PATH",
    "MLFLOW_TRACKING_AUTH",
    "MLFLOW_REGISTRY_URI",
    "DATABRICKS_HOST",
    "DATABRICKS_TOKEN",
    "DATABRICKS_CLIENT_ID",
    "DATABRICKS_CLIENT_SECRET",
    "MLFLOW_S3_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_ACCESS_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS",
)


def _active_run():
    if "mlflow" not in sys.modules:
        return None
    import mlflow

    return mlflow.active_run()


def active() -> bool:
    """Whether the driver's thread has an active MLflow run (without importing mlflow)."""
    return _active_run() is not None


def rank_environment() -> dict[str, str]:
    """Env vars that tell the ranks where the driver's active MLflow run is; {} if none.

    MLFLOW_TRACKING_URI (absolute), MLFLOW_RUN_ID, MLFLOW_EXPERIMENT_ID: no credentials
    (see `rank0_credentials`). Call it on the driver, in the thread that started the run
    (MLflow keeps the active run per thread).
    """
    run = _active_run()
    if run is None:
        return {}
    import mlflow

    uri = absolute_tracking_uri(mlflow.get_tracking_uri())
    logger.info(
        "sparkdist.tracking: rank 0 logs into run %s at %s", run.info.run_id, redact_uri(uri)
    )
    return {
        "MLFLOW_TRACKING_URI": uri,
        "MLFLOW_RUN_ID": run.info.run_id,
        "MLFLOW_EXPERIMENT_ID": run.info.experiment_id,
    }


def rank0_credentials() -> dict[str, str]:
    """Whichever of ``CREDENTIAL_ENV_VARS`` are set on the driver, for rank 0 alone, when
    a run is active; {} otherwise. Pass a name in the runner's ``env=`` to give it to
    every rank."""
    if _active_run() is None:
        return {}
    passed = [name for name in CREDENTIAL_ENV_VARS if os.environ.get(name)]
    if passed:
        logger.info("sparkdist.tracking: rank 0 gets %s", ", ".join(passed))
    return {name: os.environ[name] for name in passed}


def log_job(*, np: int, launcher: str, backend: str, wall_time_s: float, outcome: str) -> None:
    """Record one finished job in the driver's active run; no-op without one.

    The job's description goes into tags (a run may hold several jobs and MLflow params
    cannot change), the wall time into a metric whose history keeps every job. Tracking
    trouble is logged, never raised: it must not fail the job it describes.
    """
    run = _active_run()
    if run is None:
        return
    import mlflow

    try:
        mlflow.set_tags(
            {
                "sparkdist.np": str(np),
                "sparkdist.launcher": launcher,
                "sparkdist.backend": backend,
                "sparkdist.outcome": outcome,
            }
        )
        mlflow.log_metric("sparkdist.wall_time_s", float(wall_time_s))
    except Exception as error:
        logger.warning("sparkdist.tracking: could not log the job to run %s: %s", run, error)


def log_files(paths: list[str], artifact_path: str = "sparkdist") -> None:
    """Log files (a job's trace and its picture) as artifacts of the driver's active run;
    no-op without one; trouble is logged, never raised."""
    run = _active_run()
    if run is None:
        return
    import mlflow

    try:
        for path in paths:
            mlflow.log_artifact(path, artifact_path)
    except Exception as error:
        logger.warning("sparkdist.tracking: could not log %s to run %s: %s", paths, run, error)


class StepMetrics:
    """Logs a job's reported metrics as step metrics of one run, from any thread (the
    driver's handler threads see no active run: MLflow keeps it per thread)."""

    def __init__(self, run_id: str):
        from mlflow import MlflowClient

        self.run_id = run_id
        self._client = MlflowClient()
        self._failed = False

    def log(self, metrics: dict[str, float], step: int, prefix: str = "") -> None:
        """Log `metrics` at `step`; trouble is logged once, never raised."""
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        batch = [Metric(prefix + name, value, stamp, step) for name, value in metrics.items()]
        try:
            self._client.log_batch(self.run_id, metrics=batch, synchronous=True)
        except Exception as error:
            if not self._failed:
                logger.warning(
                    "sparkdist.tracking: could not log reported metrics to run %s: %s",
                    self.run_id,
                    error,
                )
            self._failed = True


def step_metrics() -> StepMetrics | None:
    """A logger of reported metrics into the active run (call it in the thread that
    started the run); None without one."""
    run = _active_run()
    return None if run is None else StepMetrics(run.info.run_id)


def quiet_mlflow() -> None:
    """Keep MLflow to its warnings: no INFO lines (creating the database tables,
    inferring a signature) and no "Downloading artifacts" bar when a model is logged.
    For the demo and scripts whose output should be sparkdist's only; MLFLOW_LOGGING_LEVEL
    and MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR, when set, win."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    if not os.environ.get("MLFLOW_LOGGING_LEVEL"):
        os.environ["MLFLOW_LOGGING_LEVEL"] = "WARNING"  # read when mlflow is imported
        logging.getLogger("mlflow").setLevel(logging.WARNING)


def use_default_tracking() -> str:
    """Use the embedded SQLite store (``default_tracking_uri()``) unless MLflow is configured.

    For demos and notebooks: with MLFLOW_TRACKING_URI set or ``mlflow.set_tracking_uri``
    called, nothing changes. Returns the tracking URI in effect.
    """
    import mlflow

    if os.environ.get("MLFLOW_TRACKING_URI") or mlflow.is_tracking_uri_set():
        return mlflow.get_tracking_uri()
    uri = default_tracking_uri()
    mlflow.set_tracking_uri(uri)
    logger.info("sparkdist.tracking: MLflow tracks into %s", uri)
    return uri
