"""Where a converter's rows come from: a source read in place, or a copy that is removed.

Real Spark (the session's local-cluster), real Parquet, a Delta log written here by hand
(no Delta jars on this machine), real ranks through HorovodRunner.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkdist import HorovodRunner, RankFailedError
from sparkdist.data import CACHE_DIR_CONF, SparkDatasetConverter, cache, fs, make_spark_converter
from sparkdist.data.driver import sources
from sparkdist.spark.file_scan import FileScan

ROWS = 600


def files_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()] if path.exists() else []


def read_all(converter: SparkDatasetConverter, columns=None) -> dict[str, np.ndarray]:
    """Every row of the converter, outside a rank (one shard), by column."""
    with converter.make_torch_dataloader(
        batch_size=128, num_epochs=1, cur_shard=0, shard_count=1, columns=columns
    ) as loader:
        batches = list(loader)

    def values(column):
        return column.numpy() if hasattr(column, "numpy") else np.asarray(column)

    return {name: np.concatenate([values(b[name]) for b in batches]) for name in batches[0]}


@pytest.fixture(scope="module")
def parquet_dir(spark, tmp_path_factory):
    """600 rows in 3 files: id, x (double), xs (3 doubles), name, and a column never selected."""
    path = tmp_path_factory.mktemp("source") / "table"
    spark.range(ROWS, numPartitions=3).selectExpr(
        "id",
        "cast(id as double) / 4 as x",
        "array(cast(id as double), 1.5, -cast(id as double)) as xs",
        "concat('row', id) as name",
        "id * 7 as unused",
    ).write.parquet(str(path))
    return path


def test_a_parquet_scan_is_read_in_place_not_copied(spark, parquet_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="sparkdist.data")
    cache_dir = tmp_path / "cache"
    df = spark.read.parquet(str(parquet_dir)).select("id", "x", "xs", "name")
    converter = make_spark_converter(df, cache_dir_url=cache_dir.as_uri())

    assert converter.source == "parquet" and converter.cache_dir_url is None
    assert files_under(cache_dir) == []  # no byte written to the cache
    sources_files = sorted(str(p) for p in parquet_dir.glob("*.parquet"))
    assert sorted(fs.filesystem_and_path(u)[1] for u in converter.file_urls) == sources_files
    assert "nothing written to the cache" in caplog.text
    assert [c.name for c in converter.layout.columns] == ["id", "x", "xs", "name"]

    rows = read_all(converter)
    order = np.argsort(rows["id"])
    assert rows["id"][order].tolist() == list(range(ROWS))
    # As a copy would deliver them: floats in float32 (the default dtype), arrays (n, 3).
    assert rows["x"].dtype == np.float32 and rows["xs"].dtype == np.float32
    np.testing.assert_allclose(rows["x"][order], np.arange(ROWS) / 4)
    assert rows["xs"].shape == (ROWS, 3)
    np.testing.assert_allclose(rows["xs"][order][:, 2], -np.arange(ROWS))
    assert rows["name"][order][:2].tolist() == ["row0", "row1"]
    converter.delete()  # nothing to delete: the source stays
    assert sorted(str(p) for p in parquet_dir.glob("*.parquet")) == sources_files


def test_what_is_copied_and_why(spark, parquet_dir, tmp_path, caplog):
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F

    caplog.set_level(logging.INFO, logger="sparkdist.data")
    source = spark.read.parquet(str(parquet_dir))
    vectors = str(tmp_path / "vectors")
    VectorAssembler(inputCols=["x"], outputCol="v").transform(source).write.parquet(vectors)
    copied = {
        "a filter": source.where("id > 10").select("id", "x"),
        "a computed column": source.select("id", (F.col("x") * 2).alias("x")),
        "a vector": spark.read.parquet(vectors).select("id", "v"),
    }
    for what, df in copied.items():
        converter = make_spark_converter(df, cache_dir_url=(tmp_path / "c").as_uri())
        assert converter.source == "copy" and converter.cache_dir_url is not None, what
        converter.delete()
    assert "the DataFrame is copied: column 'x' is computed" in caplog.text
    assert "are Spark ML vectors" in caplog.text


def test_uc_volume_and_dbfs_paths():
    assert fs.filesystem_and_path("dbfs:/Volumes/main/default/vol/cache")[1] == (
        "/Volumes/main/default/vol/cache"
    )
    assert fs.filesystem_and_path("dbfs:///Volumes/main/x")[1] == "/Volumes/main/x"
    assert fs.filesystem_and_path("dbfs:/tmp/sparkdist-cache")[1] == "/dbfs/tmp/sparkdist-cache"
    assert fs.filesystem_and_path("dbfs:/mnt/data/part-0.parquet")[1] == (
        "/dbfs/mnt/data/part-0.parquet"
    )
    assert fs.filesystem_and_path("dbfs:/VolumesX/a")[1] == "/dbfs/VolumesX/a"
    assert fs.filesystem_and_path("file:/Volumes/main/x")[1] == "/Volumes/main/x"
    assert (
        cache.resolve_parent_cache_dir_url("yarn", "dbfs:/Volumes/c/s/v/") == "dbfs:/Volumes/c/s/v"
    )


def test_conversion_names_the_column_and_the_fix(spark, tmp_path, parquet_dir):
    cache_dir = tmp_path / "cache"
    bad = {
        "column 'x' has 1 null values (of 5 rows): fill or drop them": (
            "select id, if(id = 2, null, cast(id as double)) as x from range(5)"
        ),
        "column 'xs' holds arrays of different lengths (1 to 3 elements)": (
            "select id, sequence(0, id % 3) as xs from range(6)"
        ),
        "column 'xs' has 1 arrays with null elements": (
            "select id, array(cast(id as double), if(id = 1, null, 1.0D)) as xs from range(4)"
        ),
    }
    for message, query in bad.items():
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            make_spark_converter(spark.sql(query), cache_dir_url=cache_dir.as_uri())
        assert files_under(cache_dir) == []  # the checked copy was removed again

    with pytest.raises(ValueError, match=r"tags \(map<string,bigint>\).*Cast or drop"):
        make_spark_converter(
            spark.sql("select id, map('a', id) as tags from range(3)"),
            cache_dir_url=cache_dir.as_uri(),
        )

    # A source read in place is checked too: its statistics show the nulls, a pass the lengths.
    holed = tmp_path / "holed"
    holed.mkdir()
    pq.write_table(
        pa.table({"id": [1, 2, 3], "y": [1.0, None, 3.0], "ys": [[1.0], [1.0, 2.0], [3.0]]}),
        holed / "part-0.parquet",
    )
    with pytest.raises(ValueError) as error:
        make_spark_converter(spark.read.parquet(str(holed)), cache_dir_url=cache_dir.as_uri())
    assert "column 'y' has 1 null values" in str(error.value)
    assert "column 'ys' holds arrays of different lengths (1 to 2" in str(error.value)
    assert files_under(cache_dir) == []


def stale_copy(parent: Path, name: str, age_seconds: float, lease: bool = True) -> Path:
    copy = parent / name
    copy.mkdir(parents=True)
    (copy / "part-0.parquet").write_bytes(b"x" * 1000)
    if lease:
        (copy / cache.LEASE_FILE).write_text("{}")
        then = time.time() - age_seconds
        os.utime(copy / cache.LEASE_FILE, (then, then))
    return copy


def test_stale_copies_of_dead_drivers_are_swept_by_age(spark, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="sparkdist.data")
    parent = tmp_path / "cache"
    stale = stale_copy(parent, "20240101000000-app-1-0000abcd-0000ef01", 3 * 3600)
    died_writing = stale_copy(parent, "20240101000000-app-2-0000abcd-0000ef02", 0, lease=False)
    fresh = stale_copy(parent, "20240101000000-app-3-0000abcd-0000ef03", 60)
    not_ours = stale_copy(parent, "my-own-files", 3 * 3600)
    assert cache.parse_age("2h") == 7200 and cache.parse_age("90m") == 5400
    assert cache.parse_age("30") == 30

    spark.conf.set(cache.MAX_AGE_CONF, "2h")
    try:
        converter = make_spark_converter(spark.range(10), cache_dir_url=parent.as_uri())
    finally:
        spark.conf.unset(cache.MAX_AGE_CONF)
    assert not stale.exists() and not died_writing.exists()
    assert fresh.exists() and not_ours.exists()
    assert "removed the copy at" in caplog.text and "stale: not renewed for 3.0 h" in caplog.text
    # The new copy holds a lease its driver renews.
    copy = Path(fs.filesystem_and_path(converter.cache_dir_url)[1])
    assert json.loads((copy / cache.LEASE_FILE).read_text())["pid"] == os.getpid()
    converter.delete()
    assert "; deleted)" in caplog.text


def test_petastorm_cache_conf_is_honoured(spark, tmp_path):
    assert SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF == CACHE_DIR_CONF
    spark.conf.set(cache.PETASTORM_CACHE_DIR_CONF, (tmp_path / "petastorm").as_uri())
    try:
        converter = make_spark_converter(spark.range(5))
        assert converter.cache_dir_url.startswith((tmp_path / "petastorm").as_uri() + "/")
        converter.delete()
        # Ours wins when both are set.
        spark.conf.set(
            SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, (tmp_path / "ours").as_uri()
        )
        converter = make_spark_converter(spark.range(6))
        assert converter.cache_dir_url.startswith((tmp_path / "ours").as_uri() + "/")
        converter.delete()
    finally:
        spark.conf.unset(cache.PETASTORM_CACHE_DIR_CONF)
        spark.conf.unset(CACHE_DIR_CONF)


# --- Delta: a table written here by hand (data files, JSON commits, a checkpoint) -----------


def write_delta_table(root: Path) -> dict[str, list[int]]:
    """Versions 0-2: add a, b; remove a, add c (then checkpoint); add d. Returns ids per file."""
    (root / "_delta_log").mkdir(parents=True)
    ids = {name: list(range(i * 10, i * 10 + 10)) for i, name in enumerate("abcd")}
    for name, values in ids.items():
        table = pa.table({"id": values, "x": [v / 2 for v in values]})
        pq.write_table(table, root / f"part-{name}.parquet")
    schema = json.dumps(
        {
            "type": "struct",
            "fields": [
                {"name": "id", "type": "long", "nullable": True, "metadata": {}},
                {"name": "x", "type": "double", "nullable": True, "metadata": {}},
            ],
        }
    )
    protocol = {"minReaderVersion": 1, "minWriterVersion": 2}
    metadata = {
        "id": "t",
        "format": {"provider": "parquet", "options": {}},
        "schemaString": schema,
        "partitionColumns": [],
        "configuration": {},
    }

    def add(name):
        return {
            "add": {
                "path": f"part-{name}.parquet",
                "partitionValues": {},
                "size": 1,
                "modificationTime": 0,
                "dataChange": True,
            }
        }

    def commit(version, actions):
        lines = "\n".join(json.dumps(a) for a in actions)
        (root / "_delta_log" / f"{version:020d}.json").write_text(lines + "\n")

    commit(0, [{"protocol": protocol}, {"metaData": metadata}, add("a"), add("b")])
    commit(1, [{"remove": {"path": "part-a.parquet", "dataChange": True}}, add("c")])
    # The checkpoint of version 1 (as Delta writes it: one action per row), then the log
    # before it is cleaned up, as Delta's log retention does.
    string_map = pa.map_(pa.string(), pa.string())
    checkpoint_schema = pa.schema(
        [
            (
                "add",
                pa.struct(
                    [
                        ("path", pa.string()),
                        ("partitionValues", string_map),
                        ("size", pa.int64()),
                        ("dataChange", pa.bool_()),
                    ]
                ),
            ),
            ("remove", pa.struct([("path", pa.string()), ("dataChange", pa.bool_())])),
            (
                "metaData",
                pa.struct(
                    [
                        ("id", pa.string()),
                        ("schemaString", pa.string()),
                        ("partitionColumns", pa.list_(pa.string())),
                        ("configuration", string_map),
                    ]
                ),
            ),
            (
                "protocol",
                pa.struct([("minReaderVersion", pa.int32()), ("minWriterVersion", pa.int32())]),
            ),
        ]
    )
    rows = [
        {"protocol": protocol},
        {"metaData": {**metadata, "configuration": []}},
        {"add": {"path": "part-b.parquet", "partitionValues": [], "size": 1, "dataChange": True}},
        {"add": {"path": "part-c.parquet", "partitionValues": [], "size": 1, "dataChange": True}},
    ]
    pq.write_table(
        pa.Table.from_pylist(rows, checkpoint_schema),
        root / "_delta_log" / f"{1:020d}.checkpoint.parquet",
    )
    (root / "_delta_log" / "_last_checkpoint").write_text(json.dumps({"version": 1, "size": 4}))
    (root / "_delta_log" / f"{0:020d}.json").unlink()
    commit(2, [add("d")])
    return ids


def test_delta_snapshot_from_the_log(spark, tmp_path, monkeypatch, caplog):
    root = tmp_path / "delta"
    ids = write_delta_table(root)
    snapshot = sources.read_snapshot(root.as_uri())
    assert snapshot.version == 2 and snapshot.refusal() is None
    names = [Path(fs.filesystem_and_path(u)[1]).name for u in snapshot.file_urls]
    assert names == ["part-b.parquet", "part-c.parquet", "part-d.parquet"]

    # The ranks read that snapshot in place: b, c and d's rows, never the removed a's.
    current = spark.read.parquet(*[str(root / n) for n in names])
    monkeypatch.setattr(
        sources, "plain_file_scan", lambda df, columns: FileScan("delta", (str(root),), frozenset())
    )
    converter = make_spark_converter(current, cache_dir_url=(tmp_path / "cache").as_uri())
    assert converter.source == "delta" and converter.cache_dir_url is None
    assert sorted(read_all(converter)["id"].tolist()) == ids["b"] + ids["c"] + ids["d"]
    assert files_under(tmp_path / "cache") == []

    # A scan that Spark plans over other files than the log's current ones is copied.
    everything = spark.read.parquet(str(root))
    caplog.set_level(logging.INFO, logger="sparkdist.data")
    copied = make_spark_converter(everything, cache_dir_url=(tmp_path / "cache").as_uri())
    assert copied.source == "copy"
    assert "differ from version 2 of the log" in caplog.text
    copied.delete()

    # The same directory read as plain Parquet is Spark's rows (a's too), with a warning.
    monkeypatch.undo()
    plain = make_spark_converter(everything, cache_dir_url=(tmp_path / "cache").as_uri())
    assert plain.source == "parquet" and len(plain) == 40
    assert "is a Delta table read as plain Parquet" in caplog.text

    # What plain Parquet cannot read right: deletion vectors, column mapping.
    commit = root / "_delta_log" / f"{3:020d}.json"
    commit.write_text(
        json.dumps(
            {
                "metaData": {
                    "partitionColumns": [],
                    "configuration": {"delta.columnMapping.mode": "name"},
                }
            }
        )
        + "\n"
    )
    assert sources.read_snapshot(root.as_uri()).refusal() == (
        "the Delta table maps its columns by name"
    )
    commit.write_text(
        json.dumps({"add": {"path": "part-d.parquet", "deletionVector": {"cardinality": 2}}}) + "\n"
    )
    assert "deletion vectors" in sources.read_snapshot(root.as_uri()).refusal()


# --- the runner: DataFrame arguments, read in place or copied, and the copies removed --------


def read_in_rank(direct, copied, fail):
    """Both converters' rows on this rank, and where they came from."""
    import os

    def ids(converter):
        with converter.make_torch_dataloader(batch_size=64, num_epochs=1) as loader:
            return sorted({int(i) for batch in loader for i in batch["id"]})

    copy_path = copied.cache_dir_url.removeprefix("file://")
    result = {
        "direct": (direct.source, direct.cache_dir_url, ids(direct)),
        "copied": (copied.source, copy_path, os.path.isdir(copy_path), ids(copied)),
    }
    if fail:
        raise RuntimeError(f"failing on purpose after reading {copy_path}")
    return result


def test_runner_reads_sources_in_place_and_removes_its_copies(spark, parquet_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="sparkdist.data")
    cache_dir = tmp_path / "cache"
    spark.conf.set(CACHE_DIR_CONF, cache_dir.as_uri())
    direct = spark.read.parquet(str(parquet_dir)).select("id", "x")
    copied = spark.read.parquet(str(parquet_dir)).where("id % 2 = 0").select("id")
    try:
        results = HorovodRunner(np=2).run_all(
            read_in_rank, direct=direct, copied=copied, fail=False
        )
        for rank, result in enumerate(results):
            assert result["direct"][:2] == ("parquet", None), rank
            source, copy_path, existed, _ = result["copied"]
            assert source == "copy" and existed and copy_path.startswith(str(cache_dir)), rank
        assert sorted({i for r in results for i in r["direct"][2]}) == list(range(ROWS))
        assert sorted({i for r in results for i in r["copied"][3]}) == list(range(0, ROWS, 2))
        assert files_under(cache_dir) == []  # the job's copy went when run returned
        assert "removed the copy at" in caplog.text and "wrote a copy of 300 rows" in caplog.text

        with pytest.raises(RankFailedError, match="failing on purpose after reading"):
            HorovodRunner(np=2).run(read_in_rank, direct=direct, copied=copied, fail=True)
        assert files_under(cache_dir) == []  # and after a failed run
    finally:
        spark.conf.unset(CACHE_DIR_CONF)
    assert len(list(parquet_dir.glob("*.parquet"))) == 3  # the source stays


def test_write_progress_on_the_driver(spark, tmp_path, monkeypatch, caplog):
    """Without a terminal, progress is a log line per interval; the write is a described
    Spark job; at WARNING, nothing runs."""
    from pyspark.sql import functions as F

    from sparkdist import progress as display
    from sparkdist.data.driver import writer

    monkeypatch.setattr(writer, "POLL_SECONDS", 0.05)
    monkeypatch.setattr(display, "LINE_INTERVAL_S", 0.0)
    monkeypatch.setattr(display, "mode", lambda: "lines")  # pytest's stderr may be a tty

    @F.udf("double")
    def slow(value):
        import time

        time.sleep(0.02)
        return float(value)

    df = spark.range(0, 160, 1, 8).select("id", slow("id").alias("x"))
    caplog.set_level(logging.INFO, logger="sparkdist")
    converter = make_spark_converter(df, cache_dir_url=tmp_path.as_uri())
    lines = [r.getMessage() for r in caplog.records if "writing the copy:" in r.getMessage()]
    counted = [line for line in lines if "writing the copy: 0 rows" not in line]
    assert counted, caplog.text  # rows of committed task files, seen while Spark wrote
    assert " rows (files=" in counted[-1] and "size=" in counted[-1]
    store = spark.sparkContext._jsc.sc().statusStore().jobsList(None)  # what the Spark UI shows
    descriptions = [store.apply(i).description() for i in range(store.size())]
    shown = [d.get() for d in descriptions if d.isDefined()]
    assert any(d.startswith("sparkdist data: copy of a DataFrame (2 columns) to ") for d in shown)
    converter.delete()

    monkeypatch.undo()
    caplog.set_level(logging.WARNING, logger="sparkdist")
    assert writer.WriteProgress(tmp_path.as_uri()).enabled is False
