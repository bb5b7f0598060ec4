"""petastorm's public converter behaviours, held by sparkdist.data with only the import changed.

petastorm's own suite (`petastorm/tests/test_spark_dataset_converter.py`) checks these
behaviours of `petastorm.spark`; these are our tests of the same behaviours, written
against `sparkdist.data`'s names (no code of theirs). Each test names the behaviour; the
deliberate differences (default codec, scheme-less cache URLs, ...) are asserted as ours
and listed in docs/migration.md with the argument that gives petastorm's behaviour.
Like petastorm's suite, the cache directory comes from the Spark conf
`SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF`, and TF is read as TF1 code reads it:
a graph, a one-shot iterator and a Session.
"""

from __future__ import annotations

import itertools
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pyarrow.parquet as pq
import pytest

from sparkdist.data import SparkDatasetConverter, TransformSpec, make_spark_converter

PRIMITIVE_ROWS = [
    (True, 0.12, 432.1, 5, 5, 0, "hello", bytearray(b"spark\x01\x02"), -128),
    (False, 123.45, 0.987, 9, 908, 765, "petastorm", bytearray(b"\x0012345"), 127),
]


@pytest.fixture(scope="module")
def cache_parent(spark, tmp_path_factory):
    """The parent cache directory, set as petastorm users set it: the Spark conf."""
    parent = tmp_path_factory.mktemp("petastorm-dropin")
    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, parent.as_uri())
    yield parent
    spark.conf.unset(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF)


def primitive_frame(spark, with_text: bool = True):
    """One column of each Spark primitive type, two rows, one partition (a fixed order)."""
    from pyspark.sql import types as T

    fields = [
        ("bool_col", T.BooleanType()),
        ("float_col", T.FloatType()),
        ("double_col", T.DoubleType()),
        ("short_col", T.ShortType()),
        ("int_col", T.IntegerType()),
        ("long_col", T.LongType()),
        ("str_col", T.StringType()),
        ("bin_col", T.BinaryType()),
        ("byte_col", T.ByteType()),
    ]
    schema = T.StructType([T.StructField(name, kind, False) for name, kind in fields])
    df = spark.createDataFrame(PRIMITIVE_ROWS, schema=schema).coalesce(1)
    return df if with_text else df.drop("str_col", "bin_col")


def first_tf1_batch(converter: SparkDatasetConverter, **kwargs):
    """The first batch of ``make_tf_dataset`` as TF1 code reads it (graph, iterator, Session)."""
    import tensorflow.compat.v1 as tf1

    with tf1.Graph().as_default():
        with converter.make_tf_dataset(**kwargs) as dataset:
            batch = dataset.make_one_shot_iterator().get_next()
            with tf1.Session() as session:
                return session.run(batch)


def parquet_codecs(dir_url: str) -> set[str]:
    directory = Path(urlparse(dir_url).path)
    return {
        pq.ParquetFile(path).metadata.row_group(0).column(0).compression
        for path in directory.glob("*.parquet")
    }


# --- make_tf_dataset ------------------------------------------------------------------


def test_tf1_one_shot_iterator_gives_primitive_values_and_types(spark, cache_parent):
    """petastorm's test_primitive: a tf.compat.v1 dataset, petastorm's numpy types."""
    converter = make_spark_converter(primitive_frame(spark))
    batch = first_tf1_batch(converter)  # batch_size=None: 32, so both rows
    assert len(converter) == converter.dataset_size == 2
    for i, row in enumerate(PRIMITIVE_ROWS):
        assert bool(batch.bool_col[i]) == row[0]
        assert batch.float_col[i] == pytest.approx(row[1], rel=1e-6)
        assert batch.double_col[i] == pytest.approx(row[2], rel=1e-6)  # float32 by default
        assert [batch.short_col[i], batch.int_col[i], batch.long_col[i]] == list(row[3:6])
        assert batch.str_col[i].decode() == row[6]
        assert bytearray(batch.bin_col[i]) == row[7]
        assert batch.byte_col[i] == row[8]
    types = {name: getattr(batch, name).dtype.type for name in batch._fields}
    assert types == {
        "bool_col": np.bool_,
        "float_col": np.float32,
        "double_col": np.float32,
        "short_col": np.int16,
        "int_col": np.int32,
        "long_col": np.int64,
        "str_col": np.object_,
        "bin_col": np.object_,
        "byte_col": np.int8,
    }
    converter.delete()


def test_tf_array_column_made_by_a_pandas_udf_has_its_length(spark, cache_parent):
    """petastorm's test_array_field: one-dimensional arrays come out as (batch, length)."""
    from pyspark.sql.functions import pandas_udf

    @pandas_udf("array<float>")
    def ten_floats(ids):
        return ids.map(lambda i: np.full(10, i, dtype=np.float32))

    df = spark.range(10).withColumn("v", ten_floats("id")).repartition(2)
    converter = make_spark_converter(df)
    batch = first_tf1_batch(converter, batch_size=4, num_epochs=1)
    assert batch.v.shape == (4, 10)
    np.testing.assert_array_equal(batch.v, np.repeat(batch.id[:, None], 10, 1))
    converter.delete()


def test_tf_batch_size(spark, cache_parent):
    """petastorm's test_tf_dataset_batch_size."""
    converter = make_spark_converter(spark.range(100))
    assert len(first_tf1_batch(converter, batch_size=30).id) == 30
    converter.delete()


def test_float_precision_follows_dtype_and_float16_is_refused_with_petastorms_message(
    spark, cache_parent
):
    """petastorm's test_dtype: float32 by default, float64, None keeps, float16 refused."""
    df = spark.range(10).selectExpr(
        "id", "cast(id as float) as float_col", "cast(id as double) as double_col"
    )
    by_dtype = {}
    for dtype in ("float32", "float64", None):
        converter = make_spark_converter(df, dtype=dtype)
        batch = first_tf1_batch(converter)
        by_dtype[dtype] = (batch.float_col.dtype.type, batch.double_col.dtype.type)
        converter.delete()
    assert by_dtype == {
        "float32": (np.float32, np.float32),
        "float64": (np.float64, np.float64),
        None: (np.float32, np.float64),
    }
    # petastorm's message, spaces and all: code that matches on it keeps working.
    message = "dtype float16 is not supported. " + " " * 12 + "Use 'float32' or float64"
    with pytest.raises(ValueError) as refused:
        make_spark_converter(df, dtype="float16")
    assert message in str(refused.value)


def test_array_of_doubles_becomes_float32(spark, cache_parent):
    """petastorm's test_array."""
    from pyspark.sql import types as T

    schema = T.StructType([T.StructField("c1", T.ArrayType(T.DoubleType()))])
    df = spark.createDataFrame([([1.0, 2.0, 3.0],), ([4.0, 5.0, 6.0],)], schema)
    converter = make_spark_converter(df)
    batch = first_tf1_batch(converter)
    assert batch.c1.dtype.type == np.float32
    assert sorted(batch.c1.tolist()) == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    converter.delete()


def test_ml_and_mllib_vectors_become_float32_arrays(spark, cache_parent):
    """petastorm's test_vector_to_array."""
    from pyspark.ml.linalg import Vectors
    from pyspark.mllib.linalg import Vectors as OldVectors

    rows = [
        (Vectors.dense(1.0, 2.0, 3.0), OldVectors.dense(10.0, 20.0, 30.0)),
        (Vectors.sparse(3, [0, 2], [5.0, 7.0]), OldVectors.dense(50.0, 60.0, 70.0)),
    ]
    converter = make_spark_converter(spark.createDataFrame(rows, ["vec", "oldVec"]))
    batch = first_tf1_batch(converter, num_epochs=1)
    assert batch.vec.dtype.type == batch.oldVec.dtype.type == np.float32
    assert batch.vec.shape == batch.oldVec.shape == (2, 3)
    assert sorted(batch.vec.tolist()) == [[1.0, 2.0, 3.0], [5.0, 0.0, 7.0]]
    assert sorted(batch.oldVec.tolist()) == [[10.0, 20.0, 30.0], [50.0, 60.0, 70.0]]
    converter.delete()


@pytest.mark.parametrize("loader", ["tf", "torch"])
def test_reader_arguments_are_taken(spark, cache_parent, loader):
    """petastorm's test_tf_dataset_petastorm_args / test_torch_dataloader_advanced_params.

    petastorm hands these to its reader; here they mean the same: ``reader_pool_type``
    ("dummy": no threads; "process": decode processes), ``cur_shard`` of ``shard_count``,
    ``num_epochs`` (None: repeat) and ``workers_count``.
    """
    converter = make_spark_converter(spark.range(100).repartition(4))

    def ids(**kwargs) -> list[int]:
        kwargs.setdefault("batch_size", 10)
        if loader == "tf":
            with converter.make_tf_dataset(**kwargs) as dataset:
                return [int(i) for batch in dataset.take(12) for i in batch.id.numpy()]
        with converter.make_torch_dataloader(**kwargs) as dataloader:
            return [int(i) for batch in itertools.islice(dataloader, 12) for i in batch["id"]]

    shard = ids(reader_pool_type="dummy", cur_shard=1, shard_count=4)  # num_epochs=None
    assert len(shard) == 4 * 25  # 25 rows an epoch (10, 10, 5), again and again
    assert len(set(shard)) == 25
    once = ids(num_epochs=1, workers_count=2)
    assert sorted(once) == list(range(100))
    assert ids(num_epochs=1, workers_count=2, reader_pool_type="thread") == once
    assert ids(num_epochs=1, workers_count=2, reader_pool_type="process") == once
    converter.delete()


def test_shard_follows_horovod_and_mpi_environment_and_disagreement_is_logged(
    spark, cache_parent, monkeypatch, caplog
):
    """petastorm's test_horovod_rank_compatibility.

    petastorm reads the rank from HOROVOD_RANK/SIZE, OMPI_COMM_WORLD_RANK/SIZE or
    PMI_RANK/SIZE and warns when ``cur_shard``/``shard_count`` disagree with it; sparkdist
    also takes its default shard from them (RANK/WORLD_SIZE first).
    """
    converter = make_spark_converter(spark.range(30))

    def ids(**kwargs) -> list[int]:
        with converter.make_torch_dataloader(batch_size=100, num_epochs=1, **kwargs) as dl:
            return [int(i) for batch in dl for i in batch["id"]]

    second_of_three = ids(cur_shard=1, shard_count=3)
    assert len(second_of_three) == 10
    for rank_name, size_name in [
        ("HOROVOD_RANK", "HOROVOD_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", "PMI_SIZE"),
    ]:
        with monkeypatch.context() as env:
            env.setenv(rank_name, "1")
            env.setenv(size_name, "3")
            assert ids() == second_of_three
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="sparkdist.data"):
                assert ids(cur_shard=0, shard_count=3) != second_of_three  # as asked
            assert "cur_shard=0, shard_count=3" in caplog.text and rank_name in caplog.text
    assert len(ids()) == 30  # no rank in the environment: the whole data
    converter.delete()


# --- make_torch_dataloader --------------------------------------------------------------


def test_torch_primitive_values_and_petastorms_tensor_types(spark, cache_parent):
    """petastorm's test_torch_primitive: booleans are torch.uint8, as petastorm gives."""
    import torch

    converter = make_spark_converter(primitive_frame(spark, with_text=False))
    with converter.make_torch_dataloader(num_epochs=1) as dataloader:
        (batch,) = list(dataloader)  # batch_size 32: both rows
    assert len(converter) == 2
    for i, row in enumerate(PRIMITIVE_ROWS):
        assert int(batch["bool_col"][i]) == row[0]
        assert float(batch["float_col"][i]) == pytest.approx(row[1], rel=1e-6)
        assert float(batch["double_col"][i]) == pytest.approx(row[2], rel=1e-6)
        names = ["short_col", "int_col", "long_col"]
        assert [int(batch[name][i]) for name in names] == list(row[3:6])
        assert int(batch["byte_col"][i]) == row[8]
    assert {name: values.dtype for name, values in batch.items()} == {
        "bool_col": torch.uint8,
        "float_col": torch.float32,
        "double_col": torch.float32,
        "short_col": torch.int16,
        "int_col": torch.int32,
        "long_col": torch.int64,
        "byte_col": torch.int8,
    }
    converter.delete()


def test_torch_batch_size(spark, cache_parent):
    """petastorm's test_torch_batch_size."""
    converter = make_spark_converter(spark.range(8))
    with converter.make_torch_dataloader(batch_size=2, num_epochs=1) as dataloader:
        assert [len(batch["id"]) for batch in dataloader] == [2, 2, 2, 2]
    converter.delete()


def test_torch_transform_spec_without_edit_fields_keeps_the_new_values(spark, cache_parent):
    """petastorm's test_torch_transform_spec: a function of the pandas batch, no schema."""
    converter = make_spark_converter(spark.range(8))

    def scale(frame):
        return frame * 0.1

    with converter.make_torch_dataloader(
        transform_spec=TransformSpec(scale), num_epochs=1
    ) as dataloader:
        values = [float(x) for batch in dataloader for x in batch["id"]]
    assert values == pytest.approx([i * 0.1 for i in range(8)])  # not cast back to int64
    converter.delete()


def test_torch_unexpected_keyword_is_a_type_error(spark, cache_parent):
    """petastorm's test_torch_unexpected_param."""
    converter = make_spark_converter(spark.range(8))
    with pytest.raises(TypeError, match="unexpected keyword argument 'xyz'"):
        with converter.make_torch_dataloader(xyz=1):
            pass
    converter.delete()


def test_torch_data_loader_fn_makes_the_loader(spark, cache_parent):
    """petastorm's test_torch_data_loader_fn: ``data_loader_fn`` builds what the `with` gives.

    It is called as petastorm calls it: ``data_loader_fn(reader=..., batch_size=...,
    shuffling_queue_capacity=...)``, ``reader`` being this rank's batches.
    """
    from sparkdist.data import BatchedDataLoader

    converter = make_spark_converter(spark.range(8))
    with converter.make_torch_dataloader(
        data_loader_fn=BatchedDataLoader, batch_size=2, num_epochs=1
    ) as dataloader:
        assert isinstance(dataloader, BatchedDataLoader)
        assert [len(batch["id"]) for batch in dataloader] == [2, 2, 2, 2]

    calls = []

    def id_lists(reader, batch_size, shuffling_queue_capacity):
        calls.append((batch_size, shuffling_queue_capacity))
        return [batch["id"].tolist() for batch in reader]

    with converter.make_torch_dataloader(
        data_loader_fn=id_lists, batch_size=4, num_epochs=1, shuffling_queue_capacity=8
    ) as made:
        assert sorted(i for ids in made for i in ids) == list(range(8))
        assert [len(ids) for ids in made] == [4, 4]
    assert calls == [(4, 8)]
    converter.delete()


# --- in a Spark task, and from a path ------------------------------------------------------


def test_converter_reads_inside_a_spark_task(spark, cache_parent):
    """petastorm's test_pickling_remotely (TF1) and test_torch_pickling_remotely."""
    converter = make_spark_converter(spark.range(100, 101))

    def first_ids(_):
        import tensorflow.compat.v1 as tf1  # TF1 code, as in first_tf1_batch (not importable here)

        with tf1.Graph().as_default(), converter.make_tf_dataset() as dataset:
            batch = dataset.make_one_shot_iterator().get_next()
            with tf1.Session() as session:
                from_tf = session.run(batch).id[0]
        with converter.make_torch_dataloader(num_epochs=1) as dataloader:
            from_torch = next(iter(dataloader))["id"][0]
        return int(from_tf), int(from_torch)

    assert spark.sparkContext.parallelize(range(1), 1).map(first_ids).collect() == [(100, 100)]
    converter.delete()


@pytest.mark.parametrize("as_url", [False, True])
def test_path_of_saved_parquet_data(spark, cache_parent, tmp_path, as_url):
    """petastorm's test_make_spark_convert_from_saved_df_path: a path instead of a DataFrame."""
    saved = tmp_path / "saved"
    spark.range(100, 103).write.parquet("file:" + str(saved))
    converter = make_spark_converter(saved.as_uri() if as_url else str(saved))
    assert len(converter) == 3

    def ids(_):
        with converter.make_torch_dataloader(num_epochs=1) as dataloader:
            return sorted(int(i) for batch in dataloader for i in batch["id"])

    assert spark.sparkContext.parallelize(range(1), 1).map(ids).collect() == [[100, 101, 102]]
    converter.delete()  # the saved data is the user's: read in place, never deleted
    assert sorted(p.name for p in saved.glob("*.parquet"))


# --- the cache: codec, reuse, delete, exit --------------------------------------------------


def test_compression_codec(spark, cache_parent):
    """petastorm's test_compression. Deliberate difference: None means snappy here
    (measured: as fast to read as uncompressed, smaller); "uncompressed" is petastorm's."""
    df = spark.range(10)
    assert parquet_codecs(make_spark_converter(df).cache_dir_url) == {"SNAPPY"}
    plain = make_spark_converter(df, compression_codec="uncompressed")
    assert parquet_codecs(plain.cache_dir_url) == {"UNCOMPRESSED"}
    snappy = make_spark_converter(df, compression_codec="snappy")
    assert parquet_codecs(snappy.cache_dir_url) == {"SNAPPY"}
    plain.delete()
    snappy.delete()


def test_same_plan_and_options_share_a_copy(spark, cache_parent, tmp_path):
    """petastorm's test_df_caching: one copy per plan, row group size, codec and parent."""
    df = spark.range(10)
    first = make_spark_converter(df)
    assert make_spark_converter(spark.range(10)).cache_dir_url == first.cache_dir_url
    assert make_spark_converter(spark.range(20)).cache_dir_url != first.cache_dir_url
    small = make_spark_converter(df, parquet_row_group_size_bytes=8 * 1024 * 1024)
    large = make_spark_converter(df, parquet_row_group_size_bytes=16 * 1024 * 1024)
    assert small.cache_dir_url != large.cache_dir_url
    plain = make_spark_converter(df, compression_codec="uncompressed")
    assert plain.cache_dir_url != make_spark_converter(df, compression_codec="snappy").cache_dir_url
    # Deliberate difference: None is the default codec (snappy), so it is the same copy.
    assert make_spark_converter(df, compression_codec=None).cache_dir_url == first.cache_dir_url

    other_parent = (tmp_path / "other").as_uri()
    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, other_parent)
    try:
        elsewhere = make_spark_converter(df)
        assert elsewhere.cache_dir_url != first.cache_dir_url
        # The same parent written with a trailing separator is the same parent.
        spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, other_parent + "/")
        assert make_spark_converter(df).cache_dir_url == elsewhere.cache_dir_url
    finally:
        spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, cache_parent.as_uri())


def test_delete_forgets_only_its_own_copy(spark, cache_parent):
    """petastorm's test_delete and test_df_delete_caching_meta."""
    first = make_spark_converter(spark.range(11))
    second = make_spark_converter(spark.range(21))
    assert os.path.exists(urlparse(first.cache_dir_url).path)
    first.delete()
    assert not os.path.exists(urlparse(first.cache_dir_url).path)
    assert make_spark_converter(spark.range(21)).cache_dir_url == second.cache_dir_url
    again = make_spark_converter(spark.range(11))  # written anew after delete
    assert again.cache_dir_url != first.cache_dir_url and len(again) == 11
    again.delete()
    second.delete()


def test_registered_delete_handler_is_used(spark, cache_parent):
    """petastorm's test_set_delete_handler: register_delete_dir_handler(fn), None restores."""
    from sparkdist.data import register_delete_dir_handler

    converter = make_spark_converter(spark.range(12))
    deleted = []
    register_delete_dir_handler(deleted.append)
    try:
        converter.delete()
    finally:
        register_delete_dir_handler(None)
    assert deleted == [converter.cache_dir_url]
    assert os.path.exists(urlparse(converter.cache_dir_url).path)  # the handler did nothing

    def refuse(url):
        raise RuntimeError("Not implemented delete handler.")

    register_delete_dir_handler(refuse)
    try:
        with pytest.raises(RuntimeError, match="Not implemented delete handler"):
            make_spark_converter(spark.range(12)).delete()
    finally:
        register_delete_dir_handler(None)
    fresh = make_spark_converter(spark.range(12))
    fresh.delete()  # the default handler again
    assert not os.path.exists(urlparse(fresh.cache_dir_url).path)


def test_copy_is_removed_when_the_driver_exits(tmp_path):
    """petastorm's test_atexit: the cache directory set with petastorm's conf constant."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parents[1])!r})
        from helpers import build_spark
        from sparkdist.data import SparkDatasetConverter, make_spark_converter
        spark = build_spark("local[1]")
        spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, {tmp_path.as_uri()!r})
        converter = make_spark_converter(spark.createDataFrame([(1, 2), (4, 5)], ["a", "b"]))
        print(converter.cache_dir_url, flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    cache_dir_url = done.stdout.strip().splitlines()[-1]
    assert cache_dir_url.startswith(tmp_path.as_uri() + "/")
    assert not os.path.exists(urlparse(cache_dir_url).path)


def test_scheme_less_parent_is_taken_as_a_local_path(spark, cache_parent, tmp_path):
    """petastorm refuses a scheme-less parent URL (test_check_url: 'scheme-less').

    Deliberate difference: sparkdist takes it as a local path (a file: URL), as Spark does.
    """
    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, str(tmp_path / "plain"))
    try:
        converter = make_spark_converter(spark.range(13))
    finally:
        spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, cache_parent.as_uri())
    assert converter.cache_dir_url.startswith((tmp_path / "plain").as_uri() + "/")
    converter.delete()


def test_local_cache_dir_on_a_databricks_cluster_is_warned_about(monkeypatch, caplog):
    """petastorm's test_check_parent_cache_dir_url: on a Databricks cluster (not local
    mode) a local cache directory other than the DBFS or Volumes mounts draws a warning."""
    from sparkdist.data.cache import resolve_parent_cache_dir_url

    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "15.4")
    warned = {}
    for master, url in [
        ("spark://10.0.0.1:7077", "file:/dbfs/a/b"),
        ("spark://10.0.0.1:7077", "file:/Volumes/c/s/v/cache"),
        ("spark://10.0.0.1:7077", "file:/a/b"),
        ("local[2]", "file:/dbfs/a/b"),
        ("local[2]", "file:/a/b"),
    ]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="sparkdist.data"):
            resolve_parent_cache_dir_url(master, url)
        warned[(master, url)] = "every executor" in caplog.text
    assert warned == {
        ("spark://10.0.0.1:7077", "file:/dbfs/a/b"): False,
        ("spark://10.0.0.1:7077", "file:/Volumes/c/s/v/cache"): False,
        ("spark://10.0.0.1:7077", "file:/a/b"): True,
        ("local[2]", "file:/dbfs/a/b"): False,
        ("local[2]", "file:/a/b"): False,
    }
