"""pyspark's `TorchDistributor` and `DeepspeedTorchDistributor`, on sparkdist's runner.

Same constructors, same `run(train_object, *args, **kwargs)`, same validation errors:
changing the import is the whole migration. Underneath is `HorovodRunner` (np > 0 on
the cluster for `local_mode=False`, np < 0 on the driver for `local_mode=True`), so a
job gets live rank-prefixed logs, the first failing rank's traceback, nothing left
running, retries and MLflow. Ranks see torchrun's environment (the torchrun backend),
which is what code written for TorchDistributor reads. sparkdist's own runner options
(`timeout`, `max_failures`, `launcher`, `network_interface`, ...) are keyword-only
extras passed through to `HorovodRunner`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Call:
    """`fn(*args, **kwargs)` as a payload the runner calls with no arguments."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def __call__(self) -> Any:
        return self.fn(*self.args, **self.kwargs)


def _conf(spark: Any, key: str, default: str) -> str:
    return spark.sparkContext.getConf().get(key, default)


class TorchDistributor:
    """Run a torch function or script on `num_processes` ranks, as pyspark's does.

    `local_mode=True` runs the ranks on the driver, `False` on the executors (one
    Spark task per rank). With `use_gpu`, each rank sees the GPUs Spark gave its task
    (or a share of the driver's) in CUDA_VISIBLE_DEVICES.
    """

    def __init__(
        self,
        num_processes: int = 1,
        local_mode: bool = True,
        use_gpu: bool = True,
        **runner_options: Any,
    ):
        from pyspark.sql import SparkSession

        self.spark = SparkSession.active()
        self.num_processes = num_processes
        self.local_mode = local_mode
        self.use_gpu = use_gpu
        self.runner_options = runner_options
        self.num_tasks = self._get_num_tasks()
        if self.num_processes <= 0:
            raise ValueError("num_processes has to be a positive integer")

    def _get_num_tasks(self) -> int:
        """pyspark's checks of the GPU configuration, with its messages."""
        if not self.use_gpu:
            return self.num_processes
        if not self.local_mode:
            key = "spark.task.resource.gpu.amount"
            task_gpu_amount = int(float(_conf(self.spark, key, "0")))
            if task_gpu_amount < 1:
                raise RuntimeError(f"'{key}' was unset, so gpu usage is unavailable.")
            if task_gpu_amount > 1 and self.num_processes % task_gpu_amount != 0:
                raise RuntimeError(
                    f"TorchDistributor 'num_processes' value ({self.num_processes}) "
                    "must be a multiple of 'spark.task.resource.gpu.amount' "
                    f"({task_gpu_amount}) value."
                )
            return self.num_processes // task_gpu_amount
        key = "spark.driver.resource.gpu.amount"
        if "gpu" not in self.spark.sparkContext.resources:
            raise RuntimeError("GPUs were unable to be found on the driver.")
        available = int(float(_conf(self.spark, key, "0")))
        if available == 0:
            raise RuntimeError("GPU resources were not configured properly on the driver.")
        if self.num_processes > available:
            logger.warning(
                "'num_processes' cannot be set to a value greater than the number of available "
                "GPUs on the driver, which is %d. 'num_processes' was reset to be equal to the "
                "number of available GPUs.",
                available,
            )
            self.num_processes = available
        return self.num_processes

    def _runner(self):
        from sparkdist.runner.horovod_runner import HorovodRunner

        np = -self.num_processes if self.local_mode else self.num_processes
        return HorovodRunner(np=np, **self.runner_options)

    def _script_args(self, args: tuple[Any, ...]) -> list[str]:
        return [str(a) for a in args]

    def run(self, train_object: Callable[..., Any] | str, *args: Any, **kwargs: Any) -> Any:
        """Run `train_object(*args, **kwargs)` on every rank and return rank 0's value,
        or run the script at path `train_object` with `args` as its command line
        (then return None)."""
        if isinstance(train_object, str):
            if kwargs:
                raise ValueError("Running pytorch file does not support key-word type arguments.")
            self._runner().run(train_object, args=self._script_args(args))
            return None
        return self._runner().run(_Call(train_object, args, kwargs))


class DeepspeedTorchDistributor(TorchDistributor):
    """pyspark's DeepSpeed distributor: `numGpus * nnodes` ranks; a script gets
    `--deepspeed --deepspeed_config PATH` after its own arguments, as under pyspark.
    A dict config is written to a JSON file first, as pyspark does."""

    def __init__(
        self,
        numGpus: int = 1,  # noqa: N803 - pyspark's names
        nnodes: int = 1,
        localMode: bool = True,  # noqa: N803
        useGpu: bool = True,  # noqa: N803
        deepspeedConfig: str | dict[str, Any] | None = None,  # noqa: N803
        **runner_options: Any,
    ):
        self.deepspeed_config = deepspeedConfig
        super().__init__(numGpus * nnodes, localMode, useGpu, **runner_options)

    def run(self, train_object: Callable[..., Any] | str, *args: Any, **kwargs: Any) -> Any:
        if isinstance(train_object, str) and kwargs:
            raise ValueError(
                "DeepspeedTorchDistributor with pytorch file doesn't support keyword arguments"
            )
        return super().run(train_object, *args, **kwargs)

    def _script_args(self, args: tuple[Any, ...]) -> list[str]:
        out = [*super()._script_args(args), "--deepspeed"]
        config = self.deepspeed_config
        if isinstance(config, dict):
            config = _write_config(config)
        if config:
            out += ["--deepspeed_config", os.fspath(config)]
        return out


def _write_config(config: dict[str, Any]) -> str:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
        json.dump(config, f)
    return f.name
