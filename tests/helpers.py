"""What the tests share: free ports, the Spark session they build and the fixtures defined
once (`spark`, `sc`, `converter`, `cancer`, `cancer_df`), small converters, the breast cancer
frames, a `sparkdist run` that must refuse its options, the checks that a job left no process
behind, a Spark job that holds slots (the other work of a shared cluster), and the rank and
trial functions that several tests and the Spark Connect client (tests/connect_client.py) run.

Importable from a test module in any folder of tests/, a conftest, a script under
tests/scripts or a child process (tests/ on its path), in the main environment and in each
runtime's (`make compat`: tests/compat/conftest.py takes its fixtures from here too), so it
imports at its top only what every one of them has; the rest inside the functions. Its
functions travel to the executors by value (they cannot import this module), with
sparkdist's cloudpickle and pyspark's own copy. Beside it: driver_peers.py (peers of a real
DriverService), elastic_worlds.py (the elastic torch tests' model and event logs),
cluster/checks.py (the multi-host tests').
"""

from __future__ import annotations

import _thread
import contextlib
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import pytest
from pyspark import cloudpickle as pyspark_cloudpickle

SPARK_MASTER = os.environ.get("SPARKDIST_TEST_MASTER", "local-cluster[2,1,1024]")
TEST_JVM_OPTIONS = (
    "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    " -XX:+IgnoreUnrecognizedVMOptions -XX:+UnlockDiagnosticVMOptions"
    " -XX:-BytecodeVerificationRemote"
)
"""The tests' JVMs are short-lived and do little work each: the quick compiler alone, and
one GC thread, spare most of their start-up CPU (a local-cluster session, three jobs and a
query: 34-37 CPU-s -> 21 here, on 2 cores; three Spark test modules: 157 -> 91 CPU-s).
Without verifying the bytecode of the jars they load (Spark's and Scala's, thousands of
classes a JVM; the JDK's own are never verified) a session, three jobs and a query took
20.2-23.8 CPU-s against 22.7-34.0 with the two options above alone (four alternated pairs,
each pair lower with it). Unknown options are ignored, so another JDK still starts."""
SPARK_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"}


def use_test_jvm_options() -> None:
    """Every Spark driver, executor and Connect server the tests start, in this process
    or a child, runs with `TEST_JVM_OPTIONS`: spark-submit adds SPARK_SUBMIT_OPTS to the
    driver's command line, and PySpark passes PYSPARK_SUBMIT_ARGS to spark-submit."""
    os.environ.setdefault("SPARK_SUBMIT_OPTS", TEST_JVM_OPTIONS)
    executors = f"spark.executor.defaultJavaOptions={TEST_JVM_OPTIONS}"
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", f"--conf {shlex.quote(executors)} pyspark-shell")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build_spark(master: str = SPARK_MASTER, app_name: str = "sparkdist-tests"):
    """The tests' SparkSession: `local-cluster[2,1,1024]` (two executor JVMs) unless told."""
    from sparkdist.spark.session import embedded_spark

    return embedded_spark(app_name=app_name, master=master, conf=dict(SPARK_CONF))


@contextlib.contextmanager
def small_groups_converter(df, cache_dir) -> Iterator:
    """A converter of ``df`` cached under ``cache_dir`` in small row groups (1 KiB, about
    100 rows each), so a few hundred rows make many groups; deleted on exit."""
    from sparkdist.data import make_spark_converter

    made = make_spark_converter(
        df, parquet_row_group_size_bytes=1024, cache_dir_url=cache_dir.as_uri()
    )
    try:
        yield made
    finally:
        made.delete()


# --- the fixtures, defined once: a conftest takes them in by importing them -----------


def spark_fixtures(master: str = SPARK_MASTER, app_name: str = "sparkdist-tests"):
    """The session-scoped `spark` (a `build_spark` session, stopped at the end) and `sc`
    fixtures, for a conftest to bind: ``spark, sc = spark_fixtures()``. The compatibility
    suite names its master (local-cluster whatever the main suite's) and app."""

    @pytest.fixture(scope="session")
    def spark():
        session = build_spark(master=master, app_name=app_name)
        yield session
        session.stop()

    @pytest.fixture(scope="session")
    def sc(spark):
        return spark.sparkContext

    return spark, sc


@pytest.fixture(scope="module")
def converter(request, spark, tmp_path_factory):
    """The converter of the requesting module's rows, ``converter_frame(spark)``, cached in
    small row groups (about 100 rows each) and deleted after the module."""
    df = request.module.converter_frame(spark)
    with small_groups_converter(df, tmp_path_factory.mktemp("converter-cache")) as made:
        yield made


@pytest.fixture(scope="session")
def cancer():
    """scikit-learn's breast cancer data, (X, y): 569 rows, 30 features, 2 classes."""
    from sklearn.datasets import load_breast_cancer

    return load_breast_cancer(return_X_y=True)


@pytest.fixture(scope="session")
def cancer_df(spark, cancer):
    """The breast cancer data on Spark: f0..f29, label and their 'features' vector, cached."""
    X, y = cancer
    return with_vector(spark, frame(X, y)).cache()


def frame(X, y, prefix: str = "f"):
    """A pandas frame of features ``X`` (columns f0, f1, ...) and ``label`` ``y``."""
    import pandas as pd

    data = pd.DataFrame(X, columns=[f"{prefix}{i}" for i in range(X.shape[1])])
    data["label"] = y
    return data


def with_vector(spark, data):
    """A Spark DataFrame with the feature columns and their VectorAssembler 'features'."""
    from pyspark.ml.feature import VectorAssembler

    columns = [c for c in data.columns if c != "label"]
    df = spark.createDataFrame(data)
    return VectorAssembler(inputCols=columns, outputCol="features").transform(df)


def log_from_every_rank():
    """Every rank logs a metric into the active MLflow run; returns the run's id."""
    import os

    import mlflow

    rank = int(os.environ["RANK"])
    mlflow.log_metric(f"from_rank_{rank}", rank + 1.0)
    active = mlflow.active_run()
    return active.info.run_id if active else None


def sleeps_unless_first(trial):
    """A trial objective: trial 0 returns at once, every later one runs for 10 minutes."""

    trial.suggest_float("x", 0, 1)
    if trial.number == 0:
        return 0.0
    trial.set_user_attr("started", True)
    time.sleep(600)
    return 1.0


for _pickler in (cloudpickle, pyspark_cloudpickle):
    _pickler.register_pickle_by_value(sys.modules[__name__])


def pipeline_saved_and_loaded(fitted, df, before, path):
    """Save a fitted Spark ML pipeline whose stage 1 is a `SparkPartitionEnsembleModel`
    (probabilities in column "p"), load it back, and check that it predicts ``df`` as
    ``before`` (the fitted pipeline's label/prediction/p frame) did; the loaded pipeline
    and its predictions."""
    import numpy as np
    from pyspark.ml import PipelineModel

    from sparkdist.ensemble import SparkPartitionEnsembleModel

    fitted.save(str(path))
    loaded = PipelineModel.load(str(path))
    assert isinstance(loaded.stages[1], SparkPartitionEnsembleModel)
    assert loaded.stages[1].getProbabilityCol() == "p"
    after = loaded.transform(df).select("label", "prediction", "p").toPandas()
    np.testing.assert_array_equal(after["prediction"], before["prediction"])
    np.testing.assert_allclose(
        np.stack([v.toArray() for v in after["p"]]),
        np.stack([v.toArray() for v in before["p"]]),
    )
    return loaded, after


def refused_by_sparkdist_run(tmp_path, *options: str) -> str:
    """`sparkdist run` with `options` must refuse them (exit status 2) before it reaches
    Spark (its master is an address nothing listens on) or runs the script; its stderr."""
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('must not run')\n")
    command = [sys.executable, "-m", "sparkdist.cli", "run", *options]
    done = subprocess.run(
        [*command, "--master", "spark://127.0.0.1:9", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    return done.stderr


# --- a job's processes, and the other work of a shared cluster ----------------------


class SlotHolder:
    """A Spark job whose tasks each hold one slot until `release()`: the other work of a
    shared cluster."""

    def __init__(self, sc, tmp_path: Path, slots: int):
        self.started = tmp_path / "holder-started"
        self.released = tmp_path / "holder-released"
        self.started.mkdir()
        started, released = str(self.started), str(self.released)

        def hold(rows):
            import os

            Path(started, str(os.getpid())).touch()
            while not os.path.exists(released):
                time.sleep(0.05)
            yield from rows

        def run() -> None:
            sc.setJobGroup("slot-holder", "holds slots for a test", True)
            sc.parallelize(range(slots), slots).mapPartitions(hold).collect()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        wait_for(lambda: len(list(self.started.iterdir())) == slots, "the holder's tasks")

    def release_when(self, path: Path) -> None:
        """Release the slots once `path` exists (the training code creates it)."""
        threading.Thread(
            target=lambda: (wait_for(path.exists, "the release", 300), self.release()),
            daemon=True,
        ).start()

    def release(self) -> None:
        self.released.touch()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()


def still_alive(runner) -> list:
    """The job's recorded processes (every attempt's) that are still running 15 s after
    it ended (tasks stop theirs as they end, which may be just after the driver knows)."""

    running = [p for p in runner.last_job.processes if p.alive()]
    deadline = time.monotonic() + 15
    while running and time.monotonic() < deadline:
        time.sleep(0.1)
        running = [p for p in running if p.alive()]
    return running


def pid_alive(pid: int) -> bool:
    """Whether process `pid` still exists. A zombie counts: a rank its supervisor has not
    reaped means the supervisor lives on (a test's own child that it never waits for
    needs a zombie-aware check instead, as test_connect's server has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def pid_running(pid: int) -> bool:
    """Whether process `pid` runs: not gone, and not a zombie (one whose parent is gone
    and that nobody reaps yet, or a test's own child it never waits for)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(condition, what: str, timeout_s: float = 120.0) -> None:

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def interrupt_once_ranks_ran(marker, num_ranks: int) -> threading.Thread:
    """A started thread that does what Ctrl-C does to this (main) thread once every rank
    touched `marker.RANK` (a running job's ranks say so), within 120 s."""

    def interrupt() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if all(os.path.exists(f"{marker}.{r}") for r in range(num_ranks)):
                _thread.interrupt_main()
                return
            time.sleep(0.1)

    watcher = threading.Thread(target=interrupt, daemon=True)
    watcher.start()
    return watcher


def assert_nothing_left(runner, roles: set[str] = frozenset()) -> None:
    """Every process the job recorded is gone (within 15 s of its end), and the job
    recorded a process of each of `roles`."""
    records = runner.last_job.processes
    assert roles <= {r.role for r in records}, records
    assert still_alive(runner) == []


# --- what ranks run (by value) -------------------------------------------------------


def fsdp_model():
    """A small MLP sharded with FSDP2 (each Linear, then the whole), and its optimizer."""
    import torch
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    fully_shard(model[0])
    fully_shard(model[2])
    fully_shard(model)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def train_step(model, opt, step: int) -> None:
    import torch

    batch = torch.randn(8, 16, generator=torch.Generator().manual_seed(1000 + step))
    model(batch).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


def write_row_groups(path: Path, table, groups: list[int]) -> None:
    """``table`` as one Parquet file at ``path``, in row groups of ``groups`` rows."""
    import pyarrow.parquet as pq

    with pq.ParquetWriter(path, table.schema) as writer:
        start = 0
        for size in groups:
            writer.write_table(table.slice(start, size), row_group_size=size)
            start += size


def shard_history(layout, options, worlds=(3, 2, 3), steps=(2, 3, None)) -> list:
    """Every rank's batches (`ShardReader`s of ``options``, a `ReadOptions`) as the world
    changes size mid-epoch: ``steps[i]`` lockstep steps in a world of ``worlds[i]`` ranks
    (None: to the end), then the next world resumes from rank 0's state."""
    from sparkdist.data.rank import reader

    state, out = None, []
    for world, count in zip(worlds, steps, strict=True):
        readers = [
            reader.ShardReader(layout, options, cur_shard=rank, shard_count=world)
            for rank in range(world)
        ]
        if state is not None:
            for each in readers:
                each.load_state_dict(state)
        iterators = [iter(each) for each in readers]
        taken = 0
        while count is None or taken < count:
            batches = [next(iterator, None) for iterator in iterators]
            if batches[0] is None:
                assert all(batch is None for batch in batches)
                break
            out.append(batches)
            taken += 1
        state = readers[0].state_dict()
        for each in readers:
            each.close()
    return out


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """`sparkdist ARGV...` in this process: its exit code, stdout and stderr."""
    from sparkdist.cli import main

    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


class LateCopy:
    """A copy queued on a stand-in side stream (the device feed's tests): it runs only when
    the host waits for it, or when the stand-in device catches up with its queue, as late
    as a GPU running behind the host may run it, reading the host bytes as they are then."""

    def __init__(self, host) -> None:
        import torch  # only the device feed's tests need it

        self.host, self.device, self.ran = host, torch.empty_like(host), False

    def run(self) -> None:
        if not self.ran:
            self.device.copy_(self.host)
            self.ran = True
