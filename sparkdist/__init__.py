"""sparkdist: distributed training on Apache Spark.

* `HorovodRunner(np=N).run(main, **kwargs)`: run `main` on N ranks of a Spark barrier
  stage (Horovod, torch.distributed, TensorFlow or MPI inside).
* `TorchDistributor` / `DeepspeedTorchDistributor`: pyspark's API on the same runner.
* `sparkdist.ensemble.PartitionEnsemble`: one scikit-learn/XGBoost model per partition.
* `sparkdist.elastic`: in-process elastic training (`elastic.run`, `TorchState`): survivors
  keep their processes when the world of an elastic job changes.
* `report(metrics, step)`: from any rank, metrics to the driver (progress, MLflow, tune).
* `set_log_level(level)`: how much sparkdist logs (or env SPARKDIST_LOG_LEVEL).

Names are imported on first use, so that the processes a job starts on every rank
(which import `sparkdist.runner.*` modules) start fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sparkdist import console_log

__version__ = "0.1.0"

_EXPORTS = {
    "HorovodRunner": "sparkdist.runner.driver.horovod_runner",
    "JobReport": "sparkdist.runner.driver.job_spec",
    "JobFailedError": "sparkdist.errors",
    "JobTimeoutError": "sparkdist.errors",
    "JobStalledError": "sparkdist.errors",
    "NotEnoughSlotsError": "sparkdist.errors",
    "PayloadError": "sparkdist.errors",
    "RankFailedError": "sparkdist.errors",
    "SparkdistError": "sparkdist.errors",
    "log_to_driver": "sparkdist.protocol.driver_channel",
    "report": "sparkdist.reporting",
    "set_log_level": "sparkdist.console_log",
    "TorchDistributor": "sparkdist.torch_distributor",
    "DeepspeedTorchDistributor": "sparkdist.torch_distributor",
}

__all__ = [
    "DeepspeedTorchDistributor",
    "HorovodRunner",
    "JobFailedError",
    "JobReport",
    "JobStalledError",
    "JobTimeoutError",
    "NotEnoughSlotsError",
    "PayloadError",
    "RankFailedError",
    "SparkdistError",
    "TorchDistributor",
    "log_to_driver",
    "report",
    "set_log_level",
]

if TYPE_CHECKING:
    from sparkdist.console_log import set_log_level
    from sparkdist.errors import (
        JobFailedError,
        JobStalledError,
        JobTimeoutError,
        NotEnoughSlotsError,
        PayloadError,
        RankFailedError,
        SparkdistError,
    )
    from sparkdist.protocol.driver_channel import log_to_driver
    from sparkdist.reporting import report
    from sparkdist.runner.driver.horovod_runner import HorovodRunner, JobReport
    from sparkdist.torch_distributor import DeepspeedTorchDistributor, TorchDistributor

console_log.install()


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'sparkdist' has no attribute {name!r}")
