"""`sparkdist demo`: every path of sparkdist, end to end, on an embedded local Spark.

1. the runner with DistributedDataParallel (torch.distributed over Gloo),
2. the runner with Horovod (`horovod.torch`), recording a Horovod timeline,
3. the runner with TensorFlow Keras under MultiWorkerMirroredStrategy,
4. a partition ensemble (XGBoost, one model per partition) against one model on all rows,

each tracked as an MLflow run in the embedded store (`use_default_tracking`), then a
summary table. A framework that is not installed is reported as skipped, with the fix.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

EXPERIMENT = "sparkdist-demo"
MIN_ACCURACY = {"ddp": 0.9, "horovod": 0.9, "tensorflow": 0.9, "ensemble": 0.85}


@dataclass
class Row:
    """One line of the summary table."""

    key: str
    task: str
    size: str
    accuracy: float | None = None
    seconds: float | None = None
    note: str = ""

    @property
    def failed(self) -> bool:
        minimum = MIN_ACCURACY.get(self.key)
        return minimum is not None and self.accuracy is not None and self.accuracy < minimum


@dataclass
class DemoOptions:
    np: int = 2
    executors: int = 2
    epochs: int = 20
    tf_epochs: int = 8
    models: int = 4
    output_dir: str = "sparkdist-demo"


def _say(message: str) -> None:
    print(message, flush=True)


def _start_run(name: str):
    """An MLflow run in the demo's experiment. The experiment is named per run rather
    than made the process's active one (`mlflow.set_experiment`), so that a notebook or
    test that calls the demo keeps its own."""
    import mlflow

    experiment = mlflow.get_experiment_by_name(EXPERIMENT)
    experiment_id = experiment.experiment_id if experiment else mlflow.create_experiment(EXPERIMENT)
    return mlflow.start_run(run_name=name, experiment_id=experiment_id)


def _tracked(name: str, params: dict[str, Any], job: Callable[[], dict]) -> dict:
    """Run `job` inside an MLflow run called `name`; log its params and accuracy."""
    import mlflow

    with _start_run(name):
        mlflow.log_params(params)
        result = job()
        mlflow.log_metric("test_accuracy", result["accuracy"])
    return result


def run_ddp(options: DemoOptions) -> Row:
    from sparkdist import HorovodRunner
    from sparkdist.demos.digits import train_digits_ddp

    _say(f"\n== 1. DistributedDataParallel on {options.np} ranks (torch.distributed, Gloo)")
    runner = HorovodRunner(np=options.np)
    result = _tracked(
        "ddp",
        {"np": options.np, "epochs": options.epochs},
        lambda: runner.run(train_digits_ddp, epochs=options.epochs),
    )
    return Row(
        "ddp",
        "runner: PyTorch DDP",
        f"{result['ranks']} ranks",
        result["accuracy"],
        runner.last_job.wall_time_s,
        f"{runner.last_job.launcher} launcher",
    )


def run_horovod(options: DemoOptions, output: Path) -> Row:
    task, size = "runner: Horovod (torch)", f"{options.np} ranks"
    if importlib.util.find_spec("horovod") is None:
        return Row("horovod", task, size, note="skipped: Horovod is not installed (make horovod)")
    from sparkdist import HorovodRunner
    from sparkdist.demos.horovod_digits import train_digits_horovod

    _say(f"\n== 2. Horovod on {options.np} ranks, recording a timeline")
    timeline = output / "horovod_timeline.json"
    checkpoints = output / "horovod_checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    runner = HorovodRunner(np=options.np, timeline=str(timeline))
    result = _tracked(
        "horovod",
        {"np": options.np, "epochs": options.epochs},
        lambda: runner.run(
            train_digits_horovod, epochs=options.epochs, checkpoint_dir=str(checkpoints)
        ),
    )
    return Row(
        "horovod",
        task,
        f"{result['ranks']} ranks",
        result["accuracy"],
        runner.last_job.wall_time_s,
        f"timeline {timeline.name}, {len(result['checkpoints'])} checkpoints",
    )


def run_tensorflow(options: DemoOptions, output: Path) -> Row:
    task, size = "runner: TensorFlow MWMS", f"{options.np} ranks"
    if importlib.util.find_spec("tensorflow") is None:
        return Row(
            "tensorflow",
            task,
            size,
            note="skipped: TensorFlow is not installed (pip install tensorflow-cpu)",
        )
    from sparkdist import HorovodRunner
    from sparkdist.demos.keras_digits import train_digits_keras

    _say(f"\n== 3. TensorFlow Keras, MultiWorkerMirroredStrategy on {options.np} ranks")
    runner = HorovodRunner(np=options.np)
    result = _tracked(
        "tensorflow",
        {"np": options.np, "epochs": options.tf_epochs},
        lambda: runner.run(train_digits_keras, epochs=options.tf_epochs, model_dir=str(output)),
    )
    return Row(
        "tensorflow",
        task,
        f"{result['ranks']} ranks",
        result["accuracy"],
        runner.last_job.wall_time_s,
        "model saved by rank 0" if result["saved"] else "",
    )


def run_ensemble(spark, options: DemoOptions) -> list[Row]:
    import mlflow

    from sparkdist.demos.ensemble_demo import ensemble_vs_one_model
    from sparkdist.tracking import log_ensemble

    _say(f"\n== 4. Partition ensemble of {options.models} XGBoost models vs one model")
    with _start_run("partition-ensemble"):
        result = ensemble_vs_one_model(spark, n_estimators=options.models)
        mlflow.log_params({"n_estimators": options.models, "estimator": "XGBClassifier"})
        mlflow.log_metric("test_accuracy", result.ensemble_accuracy)
        mlflow.log_metric("single_model_test_accuracy", result.single_accuracy)
        log_ensemble(result.ensemble, "ensemble")
    return [
        Row(
            "ensemble",
            "partition ensemble (XGBoost)",
            f"{result.ensemble.n_estimators_} models",
            result.ensemble_accuracy,
            result.ensemble_seconds,
            "logged as an mlflow.pyfunc model",
        ),
        Row(
            "single",
            "one model, all rows (XGBoost)",
            "1 model",
            result.single_accuracy,
            result.single_seconds,
            "on the driver, for comparison",
        ),
    ]


def format_table(rows: list[Row]) -> str:
    """The summary table: task, ranks or models, accuracy, wall time, note."""
    header = ("task", "ranks/models", "accuracy", "wall time", "")
    lines = [
        (
            row.task,
            row.size,
            "-" if row.accuracy is None else f"{row.accuracy:.4f}",
            "-" if row.seconds is None else f"{row.seconds:.1f}s",
            row.note + ("  << below the expected accuracy" if row.failed else ""),
        )
        for row in rows
    ]
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(4)]

    def fmt(cells: tuple[str, ...]) -> str:
        padded = [cell.ljust(width) for cell, width in zip(cells[:4], widths, strict=True)]
        return "  ".join([*padded, cells[4]])

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(header).rstrip(), rule] + [fmt(line).rstrip() for line in lines])


def run_demo(options: DemoOptions) -> int:
    """Run every part, print the summary; 0 when every part that ran reached its accuracy."""

    from sparkdist.spark.session import embedded_spark
    from sparkdist.tracking import quiet_mlflow, use_default_tracking

    quiet_mlflow()
    started = time.monotonic()
    output = Path(options.output_dir).resolve()
    output.mkdir(parents=True, exist_ok=True)
    _say(f"Starting an embedded Spark with {options.executors} executors ...")
    spark = embedded_spark(executors=options.executors, app_name="sparkdist-demo")
    spark_seconds = time.monotonic() - started
    _say(f"Spark ready in {spark_seconds:.1f}s: {spark.sparkContext.master}")
    tracking_uri = use_default_tracking()

    rows = [run_ddp(options), run_horovod(options, output), run_tensorflow(options, output)]
    rows += run_ensemble(spark, options)
    total = time.monotonic() - started

    _say("\n== Summary\n")
    _say(format_table(rows))
    _say("")
    _say(f"total:          {total:.1f}s (Spark start-up {spark_seconds:.1f}s)")
    _say(f"MLflow:         experiment '{EXPERIMENT}' in {tracking_uri}")
    if tracking_uri.startswith("sqlite:"):
        _say(f"                browse it: mlflow ui --backend-store-uri {tracking_uri}")
    timeline = output / "horovod_timeline.json"
    if timeline.exists():
        _say(f"timeline:       {timeline}")
        _say("                open it in chrome://tracing or https://ui.perfetto.dev")
    _say(f"outputs:        {output}")
    failed = [row.task for row in rows if row.failed]
    if failed:
        _say(f"demo FAILED: accuracy below the expected minimum for {', '.join(failed)}")
        return 1
    skipped = [row.task for row in rows if row.accuracy is None]
    if skipped:
        _say(f"demo finished; skipped: {', '.join(skipped)}")
    else:
        _say("demo finished: every part ran")
    return 0
