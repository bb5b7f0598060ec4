"""sparkdist: distributed training on Apache Spark.

* `HorovodRunner(np=N).run(main, **kwargs)`: run `main` on N ranks of a Spark barrier
  stage (Horovod, torch.distributed, TensorFlow or MPI inside).
* `sparkdist.ensemble.PartitionEnsemble`: one scikit-learn/XGBoost model per partition.
"""

from sparkdist.runner import (
    HorovodRunner,
    JobTimeoutError,
    NotEnoughSlotsError,
    PayloadError,
    RankFailedError,
    SparkdistError,
    log_to_driver,
)

__version__ = "0.1.0"

__all__ = [
    "HorovodRunner",
    "JobTimeoutError",
    "NotEnoughSlotsError",
    "PayloadError",
    "RankFailedError",
    "SparkdistError",
    "log_to_driver",
]
