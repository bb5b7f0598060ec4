"""MLflow glue: rank 0 logs into the driver's active run; nothing required otherwise.

Importing this package does not import mlflow.
"""

from sparkdist.tracking.driver import (
    CREDENTIAL_ENV_VARS,
    log_job,
    quiet_mlflow,
    rank0_credentials,
    rank_environment,
    step_metrics,
    use_default_tracking,
)
from sparkdist.tracking.ensemble_flavor import log_ensemble
from sparkdist.tracking.rank import autolog, setup_rank
from sparkdist.tracking.uris import absolute_tracking_uri, default_tracking_uri

__all__ = [
    "CREDENTIAL_ENV_VARS",
    "absolute_tracking_uri",
    "autolog",
    "default_tracking_uri",
    "log_ensemble",
    "log_job",
    "rank0_credentials",
    "quiet_mlflow",
    "rank_environment",
    "setup_rank",
    "step_metrics",
    "use_default_tracking",
]
