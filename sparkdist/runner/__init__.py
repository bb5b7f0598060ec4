"""The runner path: HorovodRunner on a Spark barrier stage, launched through mpirun."""

from sparkdist.runner.errors import (
    JobTimeoutError,
    NotEnoughSlotsError,
    PayloadError,
    RankFailedError,
    SparkdistError,
)
from sparkdist.runner.horovod_runner import HorovodRunner, JobReport
from sparkdist.runner.rank_channel import log_to_driver

__all__ = [
    "HorovodRunner",
    "JobReport",
    "JobTimeoutError",
    "NotEnoughSlotsError",
    "PayloadError",
    "RankFailedError",
    "SparkdistError",
    "log_to_driver",
]
