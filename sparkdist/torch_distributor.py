"""pyspark's `TorchDistributor` and `DeepspeedTorchDistributor`, on sparkdist's runner.

Same constructors, same `run(train_object, *args, **kwargs)`, same validation errors:
changing the import is the whole migration. Underneath is `HorovodRunner` (np > 0 on
the cluster for `local_mode=False`, np < 0 on the driver for `local_mode=True`), so a
job gets live rank-prefixed logs, the first failing rank's traceback, nothing left
running, retries and MLflow. Ranks see torchrun's environment (the torchrun backend),
which is what code written for TorchDistributor reads. sparkdist's own runner options
(`timeout`, `max_failures`, `launcher`, `network_interface`, ...) are keyword-only
extras passed through to `HorovodRunner`. docs/migration.md lists what differs.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sparkdist.backends.gpu import owned_devices
from sparkdist.protocol.script import ScriptMain
from sparkdist.spark.cluster import is_connect_session
from sparkdist.spark.gpus import driver_resources, gpu_addresses


@dataclass(frozen=True)
class _DeepspeedConfig:
    """A DeepSpeed config as the ranks get it: a path, passed on as it is when the rank
    sees that file (as pyspark passes it), else the driver's copy of the file written
    on the rank; or a dict, written to a JSON file on each rank."""

    text: str | None = None
    path: str | None = None

    @classmethod
    def of(cls, config: str | os.PathLike | dict[str, Any] | None) -> _DeepspeedConfig:
        import json

        if config is None:
            return cls()
        if isinstance(config, dict):
            return cls(text=json.dumps(config))
        if not isinstance(config, (str, os.PathLike)):
            raise TypeError(
                "deepspeedConfig must be a dict of DeepSpeed settings, the path of a JSON "
                f"config file, or None; got {type(config).__name__}"
            )
        path = os.fspath(config)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                return cls(text=f.read(), path=path)
        return cls(path=path)

    def flags(self, directory: str) -> list[str]:
        """pyspark's `--deepspeed [--deepspeed_config PATH]` for this rank."""
        if self.text is None and not self.path:
            return ["--deepspeed"]
        path = self.path
        if self.text is not None and not (path and os.path.isfile(path)):
            path = os.path.join(directory, "deepspeed_config.json")
            with open(path, "w", encoding="utf-8") as f:
                f.write(self.text)
        return ["--deepspeed", "--deepspeed_config", path]


_KEEP = "keep"
"""`_RankMain.devices`: CUDA_VISIBLE_DEVICES as the runner set it (a string, which
unpickles equal on the rank)."""


@dataclass(frozen=True)
class _RankMain:
    """What every rank runs: `fn(*args, **kwargs)` (a function, or a script as
    `ScriptMain`), in the environment pyspark's distributor gives it: the GPUs it
    chose (`devices`: a CUDA_VISIBLE_DEVICES value, None for none set, or `_KEEP` for
    the task's GPUs as the runner set them), and DeepSpeed's command-line flags."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] | None = None
    devices: str | None = _KEEP
    deepspeed: _DeepspeedConfig | None = None

    def __call__(self) -> Any:
        if self.devices is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        elif self.devices != _KEEP:
            os.environ["CUDA_VISIBLE_DEVICES"] = self.devices
        if self.deepspeed is None:
            return self.fn(*self.args, **(self.kwargs or {}))
        with tempfile.TemporaryDirectory(prefix="sparkdist-deepspeed-") as directory:
            flags = self.deepspeed.flags(directory)
            if isinstance(self.fn, ScriptMain):
                return replace(self.fn, args=(*self.fn.args, *flags))()
            # pyspark runs a function from a generated script given these flags.
            sys.argv = [sys.argv[0], *flags]
            return self.fn(*self.args, **(self.kwargs or {}))


def _conf(spark: Any, key: str, default: str) -> str:
    """A Spark setting, read as pyspark's distributor reads it (also on Spark Connect)."""
    return spark.conf.get(key, default)


class TorchDistributor:
    """Run a torch function or script on `num_processes` ranks, as pyspark's does.

    `local_mode=True` runs the ranks on the driver, `False` on the executors. With
    `use_gpu`, as under pyspark: one Spark task per `spark.task.resource.gpu.amount`
    ranks, and every rank of a task sees all its GPUs in CUDA_VISIBLE_DEVICES and
    picks one by LOCAL_RANK, as under torchrun; on the driver, the ranks share
    `num_processes` of the driver's GPUs. Without it, one task per rank; ranks on the
    cluster see no GPU, ranks on the driver the driver's CUDA_VISIBLE_DEVICES.

    `input_params` holds the inputs as pyspark's has them: `num_processes`,
    `local_mode`, `use_gpu` and `num_tasks`. Keyword-only `min_processes` /
    `max_processes` make the job elastic (on the cluster), as `HorovodRunner`'s
    `min_np`/`max_np`; other keywords go to `HorovodRunner`: `keep_warm=S` keeps the
    ranks for the next `run` (docs/warm-worlds.md), released by `close()` or at the end
    of a `with TorchDistributor(...)` block.
    """

    _ssl_conf = "pytorch.spark.distributor.ignoreSsl"
    """The Spark setting that lets a job run on a cluster with `spark.ssl.enabled`."""

    def __init__(
        self,
        num_processes: int = 1,
        local_mode: bool = True,
        use_gpu: bool = True,
        *,
        min_processes: int | None = None,
        max_processes: int | None = None,
        **runner_options: Any,
    ):
        from pyspark.sql import SparkSession

        self.spark = SparkSession.active()
        # pyspark's logger name, so code that watches its warnings keeps working.
        self.logger = logging.getLogger(type(self).__name__)
        self.num_processes = num_processes
        self.local_mode = local_mode
        self.use_gpu = use_gpu
        self.runner_options = runner_options
        if min_processes is not None or max_processes is not None:
            # Elastic, as HorovodRunner's min_np/max_np (keyword-only: pyspark's own
            # positional signature stays as it is).
            self.runner_options = {
                **runner_options,
                "min_np": min_processes,
                "max_np": max_processes,
            }
        self.num_tasks = self._get_num_tasks()
        if self.num_processes <= 0:
            raise ValueError("num_processes has to be a positive integer")
        self.input_params = self._input_params()
        self._runner()  # sparkdist's own options: a bad one fails here, not at run
        self._last_runner = None

    def __enter__(self) -> TorchDistributor:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Release the warm world of this distributor's runs (`keep_warm`), if any."""
        runner, self._last_runner = self._last_runner, None
        if runner is not None:
            runner.close()

    def _input_params(self) -> dict[str, Any]:
        return {
            "num_processes": self.num_processes,
            "local_mode": self.local_mode,
            "use_gpu": self.use_gpu,
            "num_tasks": self.num_tasks,
        }

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
        if "gpu" not in driver_resources(self.spark):
            raise RuntimeError("GPUs were unable to be found on the driver.")
        available = int(float(_conf(self.spark, key, "0")))
        if available == 0:
            raise RuntimeError("GPU resources were not configured properly on the driver.")
        if self.num_processes > available:
            self.logger.warning(
                "'num_processes' cannot be set to a value greater than the number of available "
                "GPUs on the driver, which is %d. 'num_processes' was reset to be equal to the "
                "number of available GPUs.",
                available,
            )
            self.num_processes = available
        return self.num_processes

    def _check_encryption(self) -> None:
        """pyspark's refusal to train across machines on a cluster that asks for
        encryption (`spark.ssl.enabled`): sparkdist's own channels use TLS, but the
        ranks' torch.distributed traffic (Gloo, NCCL) is not encrypted."""
        if _conf(self.spark, "spark.ssl.enabled", "false").lower() != "true":
            return
        name = type(self).__name__
        if _conf(self.spark, self._ssl_conf, "false").lower() == "true":
            self.logger.warning(
                "This cluster has TLS encryption enabled; however, %s does not support data "
                "encryption in transit. The Spark configuration '%s' has been set to 'true' "
                "to override this configuration and use %s anyway. Please note this will "
                "cause model parameters and possibly training data to be sent between nodes "
                "unencrypted.",
                name,
                self._ssl_conf,
                name,
            )
            return
        raise RuntimeError(
            f"This cluster has TLS encryption enabled; however, {name} does not support "
            f"data encryption in transit. To override this configuration and use {name} "
            f"anyway, you may set '{self._ssl_conf}' to 'true' in the Spark configuration. "
            "Please note this will cause model parameters and possibly training data to be "
            "sent between nodes unencrypted."
        )

    def _runner(self):
        from sparkdist import job_environment
        from sparkdist.runner.driver.horovod_runner import HorovodRunner

        options = dict(self.runner_options)
        # torchrun's way: a task's ranks all see its GPUs (the user's env may say otherwise).
        options["env"] = {job_environment.GPUS_PER: "task", **(options.get("env") or {})}
        if self.local_mode:
            return HorovodRunner(np=-self.num_processes, **options)
        per_task = self.num_processes // self.num_tasks
        return HorovodRunner(np=self.num_processes, ranks_per_task=per_task, **options)

    def _devices(self) -> str | None:
        """What CUDA_VISIBLE_DEVICES the ranks see, as under pyspark: on the cluster,
        their task's GPUs or none; on the driver, `num_processes` of the driver's GPUs
        (the first ones; pyspark samples them at random) or, without `use_gpu`, the
        driver's own CUDA_VISIBLE_DEVICES (also on Spark Connect, whose server's GPUs
        are not this client's)."""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if not self.local_mode:
            return _KEEP if self.use_gpu else ""
        if not self.use_gpu or is_connect_session(self.spark):
            return visible
        owned = owned_devices(gpu_addresses(driver_resources(self.spark)), visible)
        return ",".join(owned[: self.num_processes])

    def _deepspeed(self) -> _DeepspeedConfig | None:
        return None

    def run(self, train_object: Callable[..., Any] | str, *args: Any, **kwargs: Any) -> Any:
        """Run `train_object(*args, **kwargs)` on every rank and return rank 0's value,
        or run the script at path `train_object` with `args` (made strings) as its
        command line, and return None."""
        if isinstance(train_object, (str, os.PathLike)):
            if kwargs:
                raise ValueError(self._script_kwargs_error)
            fn: Callable[..., Any] = ScriptMain.from_file(train_object, [str(a) for a in args])
            args = ()
        elif callable(train_object):
            fn = train_object
        else:
            raise TypeError(
                "train_object must be a function (run on every rank; rank 0's return value "
                "is returned) or the path of a Python script (run on every rank with the "
                f"other arguments as its command line), not {type(train_object).__name__}"
            )
        if not self.local_mode:
            self._check_encryption()
        main = _RankMain(fn, args, kwargs, self._devices(), self._deepspeed())
        self._last_runner = runner = self._runner()
        return runner.run(main)

    _script_kwargs_error = "Running pytorch file does not support key-word type arguments."


class DeepspeedTorchDistributor(TorchDistributor):
    """pyspark's DeepSpeed distributor: `numGpus * nnodes` ranks; each rank's command
    line (a script's, or `sys.argv` around a function) ends with `--deepspeed
    --deepspeed_config PATH`, as under pyspark, so `deepspeed.add_config_arguments`
    and `deepspeed.initialize(args=...)` find the config. A dict config is written to
    a file on every rank, as is a config file the ranks cannot see. `input_params`
    also holds `deepspeed_config`, as pyspark's does."""

    _ssl_conf = "deepspeed.spark.distributor.ignoreSsl"

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
        self._config = _DeepspeedConfig.of(deepspeedConfig)
        super().__init__(numGpus * nnodes, localMode, useGpu, **runner_options)

    def _input_params(self) -> dict[str, Any]:
        return {"deepspeed_config": self.deepspeed_config, **super()._input_params()}

    def _deepspeed(self) -> _DeepspeedConfig:
        return self._config

    _script_kwargs_error = (
        "DeepspeedTorchDistributor with pytorch file doesn't support keyword arguments"
    )
