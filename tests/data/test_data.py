"""sparkdist.data against real Spark (local-cluster), real Parquet, real torch and TF."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import cloudpickle
import numpy as np
import pytest
from helpers import free_port

from sparkdist.data import CACHE_DIR_CONF, SparkDatasetConverter, make_spark_converter
from sparkdist.data.cache import local_default_cache_dir_url, resolve_parent_cache_dir_url

N_ROWS = 1003


def cache_dirs(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.is_dir()) if parent.exists() else []


def read_ids(converter: SparkDatasetConverter, cur_shard: int, shard_count: int, **kw) -> list:
    kw.setdefault("num_epochs", 1)
    kw.setdefault("batch_size", 64)
    with converter.make_torch_dataloader(cur_shard=cur_shard, shard_count=shard_count, **kw) as dl:
        return [int(i) for batch in dl for i in batch["id"]]


@pytest.fixture(scope="module")
def ids_converter(spark, tmp_path_factory):
    """1003 rows in 7 uneven files with small row groups (about 100 rows each)."""
    parent = tmp_path_factory.mktemp("ids-cache")
    df = spark.range(N_ROWS).selectExpr("id", "cast(id as double) / 2 as half").repartition(7)
    converter = make_spark_converter(
        df, parquet_row_group_size_bytes=1024, cache_dir_url=parent.as_uri()
    )
    yield converter
    converter.delete()


@pytest.mark.parametrize("shard_count", [1, 2, 3, 5, 16])
def test_shards_read_every_row_exactly_once(ids_converter, shard_count):
    assert len(ids_converter) == N_ROWS
    shards = [read_ids(ids_converter, k, shard_count) for k in range(shard_count)]
    everything = Counter(i for shard in shards for i in shard)
    assert sorted(everything) == list(range(N_ROWS))
    # Equal rows per rank, padded as DistributedSampler pads: a few rows twice.
    each = -(-N_ROWS // shard_count)
    assert [len(shard) for shard in shards] == [each] * shard_count
    assert sum(everything.values()) - N_ROWS == each * shard_count - N_ROWS

    dropped = [read_ids(ids_converter, k, shard_count, drop_last=True) for k in range(shard_count)]
    assert [len(shard) for shard in dropped] == [N_ROWS // shard_count] * shard_count
    assert len({i for shard in dropped for i in shard}) == N_ROWS // shard_count * shard_count


def test_more_shards_than_row_groups(spark, tmp_path):
    df = spark.range(10).coalesce(1)
    converter = make_spark_converter(df, cache_dir_url=tmp_path.as_uri())
    assert converter.layout.num_row_groups == 1
    shards = [read_ids(converter, k, 4, batch_size=3) for k in range(4)]
    assert sorted(set(i for shard in shards for i in shard)) == list(range(10))
    assert [len(s) for s in shards] == [3, 3, 3, 3]
    assert shards[3] == [9, 0, 1]  # padded from the start of the epoch's order


def test_shuffle_is_global_and_changes_each_epoch(ids_converter):
    plain = read_ids(ids_converter, 1, 3)
    shuffled = read_ids(ids_converter, 1, 3, shuffle=True, seed=7, shuffle_buffer_rows=200)
    again = read_ids(ids_converter, 1, 3, shuffle=True, seed=7, shuffle_buffer_rows=200)
    assert len(shuffled) == len(plain)
    assert sorted(shuffled) != sorted(plain)  # rows from anywhere, not rank 1's fixed range
    assert shuffled == again  # a seed makes it repeatable

    # Each epoch every row once across the ranks, and each rank a different slice.
    epochs = [
        read_ids(ids_converter, rank, 3, num_epochs=2, shuffle=True, seed=3) for rank in range(3)
    ]
    each = -(-N_ROWS // 3)
    for epoch in range(2):
        seen = [rows[epoch * each : (epoch + 1) * each] for rows in epochs]
        assert set().union(*map(set, seen)) == set(range(N_ROWS))
    assert set(epochs[0][:each]) != set(epochs[0][each:])


def test_num_epochs_none_repeats_forever(ids_converter):
    with ids_converter.make_torch_dataloader(batch_size=100, cur_shard=0, shard_count=2) as dl:
        seen = Counter()
        for step, batch in enumerate(dl):
            seen.update(int(i) for i in batch["id"])
            if step == 20:  # about four passes over the 502-row slice
                break
    assert len(seen) == -(-N_ROWS // 2)  # unshuffled: the same first half each epoch
    assert min(seen.values()) >= 3


def test_batches_are_dicts_of_tensors(ids_converter):
    import torch

    with ids_converter.make_torch_dataloader(batch_size=100, num_epochs=1) as dl:
        batches = list(dl)
    assert [len(b["id"]) for b in batches] == [100] * 10 + [3]
    first = batches[0]
    assert set(first) == {"id", "half"}
    assert first["id"].dtype == torch.int64
    assert first["half"].dtype == torch.float32  # dtype="float32" by default
    torch.testing.assert_close(first["half"], first["id"].float() / 2)


def test_same_dataframe_written_once_then_deleted(spark, tmp_path):
    df = spark.range(50).selectExpr("id", "cast(id as double) as x")
    first = make_spark_converter(df, cache_dir_url=tmp_path.as_uri())
    # An equivalent DataFrame built again has the same plan: no second write.
    same = make_spark_converter(
        spark.range(50).selectExpr("id", "cast(id as double) as x"),
        cache_dir_url=tmp_path.as_uri(),
    )
    assert same.cache_dir_url == first.cache_dir_url
    assert len(cache_dirs(tmp_path)) == 1

    other_dtype = make_spark_converter(df, dtype="float64", cache_dir_url=tmp_path.as_uri())
    other_rows = make_spark_converter(df.where("id < 10"), cache_dir_url=tmp_path.as_uri())
    assert len({first.cache_dir_url, other_dtype.cache_dir_url, other_rows.cache_dir_url}) == 3
    assert len(other_rows) == 10
    assert len(cache_dirs(tmp_path)) == 3

    first.delete()
    assert len(cache_dirs(tmp_path)) == 2
    rewritten = make_spark_converter(df, cache_dir_url=tmp_path.as_uri())
    assert rewritten.cache_dir_url != first.cache_dir_url
    assert len(rewritten) == 50
    for converter in (rewritten, other_dtype, other_rows):
        converter.delete()
    assert cache_dirs(tmp_path) == []


def test_cache_dir_resolution(spark, tmp_path):
    assert resolve_parent_cache_dir_url("local[2]", None) == local_default_cache_dir_url()
    assert resolve_parent_cache_dir_url("local-cluster[2,1,1024]", None).startswith("file:")
    assert resolve_parent_cache_dir_url("yarn", "s3a://bucket/cache/") == "s3a://bucket/cache"
    assert resolve_parent_cache_dir_url("yarn", "file:/a", "file:/b") == "file:/b"
    assert resolve_parent_cache_dir_url("local", None, "/tmp/x") == "file:///tmp/x"
    with pytest.raises(ValueError, match=CACHE_DIR_CONF.replace(".", r"\.")):
        resolve_parent_cache_dir_url("spark://10.0.0.1:7077", None)

    # The Spark conf key on a live session.
    conf_dir = tmp_path / "from-conf"
    spark.conf.set(CACHE_DIR_CONF, conf_dir.as_uri())
    try:
        converter = make_spark_converter(spark.range(5))
    finally:
        spark.conf.unset(CACHE_DIR_CONF)
    assert converter.cache_dir_url.startswith(conf_dir.as_uri() + "/")
    assert len(cache_dirs(conf_dir)) == 1
    converter.delete()


def test_vectors_become_float_arrays_with_dtype_control(spark, tmp_path):
    import torch
    from pyspark.ml.linalg import Vectors

    rows = [(i, Vectors.dense([i, i / 4, -i]), float(i) / 3) for i in range(40)]
    df = spark.createDataFrame(rows, ["id", "features", "target"])
    expected = np.array([[i, i / 4, -i] for i in range(40)])
    for dtype, torch_dtype in [("float32", torch.float32), ("float64", torch.float64)]:
        converter = make_spark_converter(df, dtype=dtype, cache_dir_url=tmp_path.as_uri())
        with converter.make_torch_dataloader(batch_size=40, num_epochs=1) as dl:
            (batch,) = list(dl)
        assert batch["features"].dtype == torch_dtype and batch["features"].shape == (40, 3)
        assert batch["target"].dtype == torch_dtype
        order = batch["id"].numpy()
        np.testing.assert_allclose(batch["features"].numpy(), expected[order], rtol=1e-6)
        converter.delete()

    # dtype=None keeps floats as they are (vectors are doubles).
    kept = make_spark_converter(
        df.selectExpr("id", "features", "cast(target as float) as target"),
        dtype=None,
        cache_dir_url=tmp_path.as_uri(),
    )
    with kept.make_torch_dataloader(batch_size=8, num_epochs=1) as dl:
        batch = next(iter(dl))
    assert batch["features"].dtype == torch.float64
    assert batch["target"].dtype == torch.float32
    kept.delete()


def test_bad_input_is_named_before_any_write(spark, tmp_path):
    df = spark.sql(
        "select id, map('a', id) as tags, cast(id as decimal(10, 2)) as price from range(3)"
    )
    with pytest.raises(ValueError) as error:
        make_spark_converter(df, cache_dir_url=tmp_path.as_uri())
    message = str(error.value)
    assert "tags (map<string,bigint>)" in message and "price (decimal(10,2))" in message
    assert "id (" not in message  # the supported column is not blamed
    assert cache_dirs(tmp_path) == []

    with pytest.raises(ValueError, match="dtype"):
        make_spark_converter(spark.range(3), dtype="float16", cache_dir_url=tmp_path.as_uri())

    # Null values and ragged arrays: refused at conversion (test_data_sources.py has more).
    nulls = spark.sql("select id, if(id = 2, null, cast(id as double)) as x from range(5)")
    with pytest.raises(ValueError, match="column 'x' has 1 null values"):
        make_spark_converter(nulls, cache_dir_url=tmp_path.as_uri())
    ragged = spark.sql("select id, sequence(0, id % 3) as xs from range(6)")
    with pytest.raises(ValueError, match="column 'xs' holds arrays of different lengths"):
        make_spark_converter(ragged, cache_dir_url=tmp_path.as_uri())
    assert cache_dirs(tmp_path) == []

    converter = make_spark_converter(spark.range(4), cache_dir_url=tmp_path.as_uri())
    with pytest.raises(ValueError, match="cur_shard"):
        converter.make_torch_dataloader(cur_shard=2, shard_count=2)
    converter.delete()


def test_handle_is_small_picklable_and_takes_its_shard_from_env(ids_converter, monkeypatch):
    payload = cloudpickle.dumps(ids_converter)
    assert len(payload) < 16_384
    handle = cloudpickle.loads(payload)
    assert len(handle) == N_ROWS

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with handle.make_torch_dataloader(batch_size=64, num_epochs=1) as dl:
        from_env = [int(i) for batch in dl for i in batch["id"]]
    assert from_env == read_ids(ids_converter, 1, 3)

    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert len(read_ids(handle, None, None)) == N_ROWS  # outside a rank: everything


def test_tf_dataset_yields_namedtuple_batches_per_shard(spark, tmp_path):
    import tensorflow as tf
    from pyspark.ml.linalg import Vectors

    rows = [(i, Vectors.dense([i, 2 * i]), f"row{i}") for i in range(101)]
    df = spark.createDataFrame(rows, ["id", "features", "name"]).repartition(3)
    converter = make_spark_converter(df, cache_dir_url=tmp_path.as_uri())
    seen = []
    for shard in range(2):
        with converter.make_tf_dataset(
            batch_size=16, num_epochs=1, cur_shard=shard, shard_count=2
        ) as ds:
            assert ds.element_spec.features.shape.as_list() == [None, 2]
            for batch in ds:
                assert batch.features.dtype == tf.float32
                np.testing.assert_allclose(
                    batch.features.numpy(), np.stack([batch.id, 2 * batch.id], 1)
                )
                assert batch.name.numpy()[0].decode().startswith("row")
                seen.extend(int(i) for i in batch.id.numpy())
    assert sorted(set(seen)) == list(range(101))
    assert len(seen) == 102  # 51 rows per rank, one padded

    # Keras-style (features, label) pairs, infinite epochs.
    with converter.make_tf_dataset(batch_size=32) as ds:
        pairs = ds.map(lambda b: (b.features, b.id)).take(10)
        # Batches never span two epochs: 32, 32, 32, 5 per epoch of 101 rows.
        assert [int(x.shape[0]) for x, _ in pairs] == [32, 32, 32, 5] * 2 + [32, 32]
        assert ds.steps_per_epoch == 4
    converter.delete()


def test_backend_choice_is_logged(spark, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="sparkdist.data")
    converter = make_spark_converter(spark.range(3), cache_dir_url=tmp_path.as_uri())
    assert converter.backend == "pyarrow"  # petastorm does not import on pyarrow >= 15
    assert "sparkdist.data: using the pyarrow reader" in caplog.text  # auto never petastorm
    with pytest.raises(ImportError, match="petastorm"):
        make_spark_converter(spark.range(3), backend="petastorm", cache_dir_url=tmp_path.as_uri())
    converter.delete()


def test_driver_removes_its_cache_at_exit(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parents[1])!r})
        from helpers import build_spark
        from sparkdist.data import make_spark_converter
        spark = build_spark("local[1]")
        converter = make_spark_converter(spark.range(20), cache_dir_url={tmp_path.as_uri()!r})
        print(converter.cache_dir_url, flush=True)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().startswith(tmp_path.as_uri())
    assert cache_dirs(tmp_path) == []  # written, then removed by the atexit hook


# --- DDP on digits: 2 ranks fed from a Spark DataFrame vs the in-memory version --------

EPOCHS = 15
PER_RANK_BATCH = 32
WORLD = 2

MODEL_CODE = """
import torch

def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
    )

def accuracy(model, x, y):
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())
"""

WORKER = """
import json, os, sys
import cloudpickle, numpy as np, torch, torch.distributed as dist
sys.path.insert(0, os.environ["MODEL_DIR"])
from digits_model import make_model, accuracy

torch.set_num_threads(1)
dist.init_process_group("gloo")
with open(os.environ["HANDLE"], "rb") as f:
    converter = cloudpickle.load(f)
model = torch.nn.parallel.DistributedDataParallel(make_model())
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
steps_per_epoch = len(converter) // (int(os.environ["PER_RANK_BATCH"]) * dist.get_world_size())
total = steps_per_epoch * int(os.environ["EPOCHS"])
# No cur_shard/shard_count: the shard comes from RANK/WORLD_SIZE.
with converter.make_torch_dataloader(
    batch_size=int(os.environ["PER_RANK_BATCH"]), shuffle=True, seed=dist.get_rank()
) as loader:
    for step, batch in zip(range(total), loader):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(batch["features"]), batch["label"])
        loss.backward()
        optimizer.step()
if dist.get_rank() == 0:
    test = np.load(os.environ["TEST_DATA"])
    result = {"accuracy": accuracy(model.module, test["x"], test["y"]), "steps": total}
    with open(os.environ["RESULT"], "w") as f:
        json.dump(result, f)
dist.destroy_process_group()
"""


def test_ddp_on_digits_from_spark_matches_in_memory(spark, tmp_path):
    import torch
    from pyspark.ml.linalg import Vectors
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.25, random_state=0, stratify=digits.target
    )
    rows = [
        (Vectors.dense(f.tolist()), int(label)) for f, label in zip(x_train, y_train, strict=True)
    ]
    df = spark.createDataFrame(rows, ["features", "label"]).repartition(3)
    converter = make_spark_converter(df, cache_dir_url=(tmp_path / "cache").as_uri())
    assert len(converter) == len(x_train)

    (tmp_path / "digits_model.py").write_text(MODEL_CODE)
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "handle.pkl").write_bytes(cloudpickle.dumps(converter))
    np.savez(tmp_path / "test.npz", x=x_test, y=y_test)
    port = free_port()
    procs = []
    for rank in range(WORLD):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(WORLD),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            MODEL_DIR=str(tmp_path),
            HANDLE=str(tmp_path / "handle.pkl"),
            TEST_DATA=str(tmp_path / "test.npz"),
            RESULT=str(tmp_path / "result.json"),
            EPOCHS=str(EPOCHS),
            PER_RANK_BATCH=str(PER_RANK_BATCH),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(tmp_path / "worker.py")],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=150)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    distributed = json.loads((tmp_path / "result.json").read_text())

    # The in-memory version: same model, same global batch (2 x 32), same number of steps.
    sys.path.insert(0, str(tmp_path))
    try:
        from digits_model import accuracy, make_model
    finally:
        sys.path.remove(str(tmp_path))
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = np.random.default_rng(0)
    features, labels = torch.from_numpy(x_train), torch.from_numpy(y_train)
    global_batch = PER_RANK_BATCH * WORLD
    steps = 0
    while steps < distributed["steps"]:
        order = torch.from_numpy(generator.permutation(len(x_train)))
        for start in range(0, len(order) - global_batch + 1, global_batch):
            if steps == distributed["steps"]:
                break
            idx = order[start : start + global_batch]
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(features[idx]), labels[idx])
            loss.backward()
            optimizer.step()
            steps += 1
    in_memory = accuracy(model, x_test, y_test)

    assert in_memory > 0.9
    assert distributed["accuracy"] >= in_memory - 0.02, (distributed, in_memory)
    converter.delete()


def test_torch_loader_is_a_dataloader_with_workers_collate_and_pin_memory(ids_converter):
    from torch.utils.data import DataLoader

    shard = {"cur_shard": 1, "shard_count": 3, "shuffle": True, "seed": 3, "batch_size": 64}
    alone = read_ids(ids_converter, **{**shard, "num_epochs": 2})
    with ids_converter.make_torch_dataloader(
        num_epochs=2, num_workers=2, pin_memory=True, **shard
    ) as loader:
        assert isinstance(loader, DataLoader)
        assert len(loader) == 12  # 335 rows of 1003 for each of 3 ranks: 5 x 64 + 15
        batches = list(loader)
    # Two decode processes, each making every other batch: the same batches, in order
    # (across the epochs too: 6 batches an epoch).
    assert [int(i) for batch in batches for i in batch["id"]] == alone
    with ids_converter.make_torch_dataloader(
        num_epochs=1, collate_fn=lambda batch: int(batch["id"].sum()), workers_count=3, **shard
    ) as loader:
        assert sum(loader) == sum(alone[:335])


def test_device_batches_are_the_cpu_batches_and_counted_when_handed_out(ids_converter):
    """device="cpu" runs the device prefetch (a batch copied ahead of use): the same
    batches; the position counts the batches handed out, not the one copied ahead."""
    shard = {"cur_shard": 0, "shard_count": 2, "shuffle": True, "seed": 5, "batch_size": 100}
    alone = read_ids(ids_converter, **shard)
    with ids_converter.make_torch_dataloader(num_epochs=1, device="cpu", **shard) as loader:
        batches = iter(loader)
        first = [int(i) for _ in range(2) for i in next(batches)["id"]]
        assert loader.state_dict()["rows_consumed"] == 2 * 100 * 2  # 2 batches, 2 ranks
        rest = [int(i) for batch in batches for i in batch["id"]]
    assert first + rest == alone
    with pytest.raises(ValueError, match="DevicePrefetcher"):
        ids_converter.make_torch_dataloader(device="cpu", data_loader_fn=lambda **kw: None)


def test_resume_in_a_smaller_world_reads_the_rest_of_the_epoch(ids_converter):
    """3 ranks read 2 batches each; 2 ranks, from rank 0's state, read the rest."""
    kw = {"batch_size": 50, "num_epochs": 1, "shuffle": True, "seed": 9}
    seen, states = [], []
    for rank in range(3):
        with ids_converter.make_torch_dataloader(cur_shard=rank, shard_count=3, **kw) as dl:
            batches = iter(dl)
            for _ in range(2):
                seen += [int(i) for i in next(batches)["id"]]
            states.append(dl.state_dict())
    assert states[0] == states[1] == states[2]
    assert states[0]["epoch"] == 0 and states[0]["rows_consumed"] == 300
    rest = []
    for rank in range(2):
        with ids_converter.make_torch_dataloader(cur_shard=rank, shard_count=2, **kw) as dl:
            dl.load_state_dict(states[0])
            rest.append([int(i) for batch in dl for i in batch["id"]])
            assert dl.epoch == 1
    assert len(rest[0]) == len(rest[1]) == -(-(N_ROWS - 300) // 2)
    counts = Counter(seen + rest[0] + rest[1])
    assert sorted(counts) == list(range(N_ROWS))
    assert sum(counts.values()) == N_ROWS + 1  # 703 rows left for 2 ranks: one pad


def test_tf_position_is_exact_behind_prefetch_with_steps(ids_converter):
    """tf.data takes batches ahead (AUTOTUNE); state_dict(steps=2) is the place after 2."""
    kw = {"batch_size": 50, "num_epochs": 1, "shuffle": True, "seed": 3}
    seen, states, taken = [], [], []
    for rank in range(3):
        with ids_converter.make_tf_dataset(cur_shard=rank, shard_count=3, **kw) as ds:
            batches = iter(ds)
            for _ in range(2):
                seen += [int(i) for i in next(batches).id.numpy()]
            took = ds.state_dict()
            taken.append((took["epoch"], took["rows_consumed"]))
            states.append(ds.state_dict(steps=2))
            with pytest.raises(ValueError, match="steps=8: an iteration of this loader has 7"):
                ds.state_dict(steps=8)
    assert states[0] == states[1] == states[2]
    assert states[0]["rows_consumed"] == 300  # 3 ranks x 2 steps x 50 rows
    assert max(taken) >= (0, 300)  # what tf.data took (usually more than the steps taken)
    rest = []
    for rank in range(2):
        with ids_converter.make_tf_dataset(cur_shard=rank, shard_count=2, **kw) as ds:
            ds.load_state_dict(states[0])
            rest.append([int(i) for batch in ds for i in batch.id.numpy()])
    counts = Counter(seen + rest[0] + rest[1])
    assert sorted(counts) == list(range(N_ROWS))
    assert sum(counts.values()) == N_ROWS + 1  # 703 rows left for 2 ranks: one pad


def test_petastorm_documented_usage_runs_with_the_import_changed(spark, tmp_path):
    """The Databricks petastorm page's code, with `petastorm.spark` -> `sparkdist.data`."""
    import tensorflow as tf

    from sparkdist.data import SparkDatasetConverter, TransformSpec, make_spark_converter

    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, tmp_path.as_uri())
    try:
        df = spark.range(600).selectExpr(
            "array(cast(id as float), cast(id % 7 as float)) as features", "id % 3 as label_index"
        )
        converter_train = make_spark_converter(df)
    finally:
        spark.conf.unset(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF)
    assert converter_train.cache_dir_url.startswith(tmp_path.as_uri())

    def transform_row(pd_batch):
        pd_batch["features"] = pd_batch["features"].map(lambda x: np.append(x, 1.0) / 600)
        pd_batch["label_index"] = pd_batch["label_index"] * 10
        return pd_batch

    transform_spec_fn = TransformSpec(
        transform_row,
        edit_fields=[("features", np.float32, (3,), False)],
        selected_fields=["features", "label_index"],
    )
    batch_size = 32
    with converter_train.make_torch_dataloader(
        transform_spec=transform_spec_fn,
        batch_size=batch_size,
        num_epochs=1,
        shuffling_queue_capacity=128,
        workers_count=2,
    ) as train_dataloader:
        train_dataloader_iter = iter(train_dataloader)
        steps_per_epoch = len(converter_train) // batch_size
        labels = []
        for _ in range(steps_per_epoch):
            pd_batch = next(train_dataloader_iter)
            assert pd_batch["features"].shape == (batch_size, 3)
            assert float(pd_batch["features"][0, 2]) == pytest.approx(1 / 600)
            labels += pd_batch["label_index"].tolist()
    assert set(labels) == {0, 10, 20}

    with converter_train.make_tf_dataset(
        transform_spec=transform_spec_fn, batch_size=batch_size, workers_count=2
    ) as dataset:
        assert dataset.element_spec.features.shape.as_list() == [None, 3]
        dataset = dataset.map(lambda x: (x.features, x.label_index // 10))
        model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(3)])
        model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = model.fit(dataset, steps_per_epoch=len(converter_train) // batch_size, epochs=2)
        assert len(history.history["loss"]) == 2
    converter_train.delete()
