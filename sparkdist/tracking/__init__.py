"""MLflow glue: rank 0 logs into the driver's active run; nothing required otherwise.

Importing this package does not import mlflow. A partition ensemble's MLflow flavor is
the ensemble's (`sparkdist.ensemble.log_ensemble`); `log_ensemble` here is its old name.
"""

import importlib
import warnings
from typing import Any

from sparkdist.tracking.driver import (
    CREDENTIAL_ENV_VARS,
    active,
    log_files,
    log_job,
    quiet_mlflow,
    rank0_credentials,
    rank_environment,
    step_metrics,
    use_default_tracking,
)
from sparkdist.tracking.rank import TRACKING_ENV, autolog, hand_back, setup_rank
from sparkdist.tracking.uris import absolute_tracking_uri, default_tracking_uri

__all__ = [
    "CREDENTIAL_ENV_VARS",
    "TRACKING_ENV",
    "absolute_tracking_uri",
    "active",
    "autolog",
    "default_tracking_uri",
    "hand_back",
    "log_files",
    "log_job",
    "rank0_credentials",
    "quiet_mlflow",
    "rank_environment",
    "setup_rank",
    "step_metrics",
    "use_default_tracking",
]


def __getattr__(name: str) -> Any:
    """The old name `log_ensemble` here, kept for code written before it moved."""
    if name == "log_ensemble":
        warnings.warn(
            "sparkdist.tracking.log_ensemble is now sparkdist.ensemble.log_ensemble",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module("sparkdist.ensemble.mlflow_flavor").log_ensemble
    raise AttributeError(f"module 'sparkdist.tracking' has no attribute {name!r}")
