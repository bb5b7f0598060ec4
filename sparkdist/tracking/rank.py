"""Rank side: rank 0 joins the driver's run; the other ranks stay out of it.

The driver owns the run's lifecycle: rank 0 resumes it to log into it but leaves it
RUNNING when its process exits (MLflow would otherwise mark it FINISHED at exit).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys

from sparkdist.tracking.uris import redact_uri

logger = logging.getLogger(__name__)


def _rank() -> str | None:
    return os.environ.get("RANK")


def _leave_run_running(run_id: str) -> None:
    """At exit, before MLflow's own hook: hand the run back without finishing it."""
    try:
        import mlflow

        active = mlflow.active_run()
        if active is not None and active.info.run_id == run_id:
            mlflow.end_run(status="RUNNING")
    except Exception as error:  # exiting anyway; the driver still ends the run
        logger.warning("sparkdist.tracking: could not hand run %s back: %s", run_id, error)


TRACKING_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID")
"""What `driver.rank_environment` sets: a warm world's run replaces it with its own."""


def hand_back() -> None:
    """After a warm world's run: the driver's run that rank 0 joined is handed back,
    still RUNNING, so the next run joins whichever run is active on the driver then."""
    run_id = os.environ.get("MLFLOW_RUN_ID")
    if run_id and "mlflow" in sys.modules:
        _leave_run_running(run_id)


def setup_rank() -> None:
    """Call in each rank, in the thread that runs ``main``, before ``main``.

    Rank 0 with MLFLOW_RUN_ID set makes that run active, so ``mlflow.log_*`` in main land
    in the driver's run. Other ranks drop MLFLOW_RUN_ID so they cannot write into it.
    Without MLFLOW_RUN_ID it does nothing and does not import mlflow.
    """
    run_id = os.environ.get("MLFLOW_RUN_ID")
    if not run_id:
        return
    if _rank() not in (None, "0"):
        del os.environ["MLFLOW_RUN_ID"]
        return
    import mlflow

    active = mlflow.active_run()
    if active is not None:
        if active.info.run_id != run_id:
            logger.warning(
                "sparkdist.tracking: run %s is already active here; not switching to the "
                "driver's run %s",
                active.info.run_id,
                run_id,
            )
        return
    mlflow.start_run(run_id=run_id)
    atexit.register(_leave_run_running, run_id)
    logger.info(
        "sparkdist.tracking: rank 0 logs into run %s at %s",
        run_id,
        redact_uri(mlflow.get_tracking_uri()),
    )


def autolog(**kwargs) -> bool:
    """``mlflow.autolog(**kwargs)`` on rank 0 only; True when it was turned on.

    Inside a rank, it needs a tracking destination from the driver (an active run there
    when ``run`` was called), else the logs would land in an executor's scratch
    directory, so it stays off. Outside any rank it simply turns autologging on.
    """
    rank = _rank()
    if rank not in (None, "0"):
        return False
    if rank == "0" and not os.environ.get("MLFLOW_TRACKING_URI"):
        logger.info("sparkdist.tracking: no MLflow run on the driver; autologging stays off")
        return False
    import mlflow

    mlflow.autolog(**kwargs)
    return True
