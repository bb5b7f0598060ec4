"""Plain Parquet scans: pyarrow reads the files in the source tasks, into the same ensemble
as when Spark reads them."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
from ensemble_data import logistic, parquet_source_of, write_parquet_files, xgb_classifier
from helpers import frame

from sparkdist.ensemble import PartitionEnsemble
from sparkdist.ensemble.model.features import FeatureSpec

# --- plain Parquet scans: pyarrow reads the files in the source tasks ---------------------


def test_plain_parquet_scan_is_read_by_pyarrow_into_the_same_ensemble(spark, tmp_path, cancer):
    """One file in one Spark partition: both paths draw the same spread, so the ensemble is
    the same model for model whichever reads the rows."""
    from pyspark.sql import functions as F

    X, y = cancer
    path = write_parquet_files(tmp_path / "one", frame(X, y), n_files=1, row_group_size=1000)
    columns = [f"f{i}" for i in range(X.shape[1])]
    direct = spark.read.parquet(path)
    through_spark = direct.filter(F.col("label") >= 0)  # a Filter: Spark reads
    assert parquet_source_of(direct, columns) is not None
    assert parquet_source_of(through_spark, columns) is None
    assert through_spark.rdd.getNumPartitions() == 1

    def fit(df):
        return PartitionEnsemble(xgb_classifier(), n_estimators=3, random_state=5).fit(df, columns)

    a, b = fit(direct), fit(through_spark)
    assert [s.rows for s in a.estimators_stats_] == [s.rows for s in b.estimators_stats_]
    assert sum(s.rows for s in a.estimators_stats_) == len(y)
    np.testing.assert_array_equal(a.predict_proba(X), b.predict_proba(X))


def test_parquet_splits_cover_every_row_group_once(spark, cancer_parquet, cancer, monkeypatch):
    import pyarrow.parquet as pq

    from sparkdist.ensemble.fit import parquet_source

    X, y = cancer
    # Below a few MB the data is one split; lift that floor to see it spread over slots.
    monkeypatch.setattr(parquet_source, "_OPEN_COST_BYTES", 1)
    df = spark.read.parquet(cancer_parquet)
    source = parquet_source_of(df, [f"f{i}" for i in range(X.shape[1])])
    read = sorted(
        (url, group) for split in source.splits for url, groups in split.parts for group in groups
    )
    files = sorted(df.inputFiles())
    expected = [
        (url, group) for url in files for group in range(pq.read_metadata(url[7:]).num_row_groups)
    ]
    assert read == expected and len(files) == 2 and len(expected) == 6
    # Spread evenly over the 2 task slots: a split per slot, not one per row group.
    assert len(source.splits) == 2

    model = PartitionEnsemble(logistic(), n_estimators=4, random_state=1).fit(
        df, [f"f{i}" for i in range(X.shape[1])]
    )
    assert sum(s.rows for s in model.estimators_stats_) == len(y)
    assert model.score(X, y) > 0.9


def test_shuffle_of_a_plain_parquet_scan_read_in_place_spreads_rows_at_random(
    spark, tmp_path, cancer
):
    """K=2 on 2 slots: each model's task reads every row and keeps those drawn for it.
    Sorted by label, the rows' order would show a split by position: each model sees both
    classes, every row goes to one model, and the same seed draws the same rows."""
    from sparkdist.ensemble.fit.driver import ReadInPlace, plan_fit

    X, y = cancer
    order = np.argsort(y, kind="stable")
    path = write_parquet_files(tmp_path / "sorted", frame(X[order], y[order]), row_group_size=50)
    columns = [f"f{i}" for i in range(X.shape[1])]
    df = spark.read.parquet(path)
    ensemble = PartitionEnsemble(logistic(), n_estimators=2, random_state=4)
    _, route = plan_fit(ensemble.get_params(), df, columns, "label")
    assert isinstance(route, ReadInPlace) and route.n_tasks == 2

    model = ensemble.fit(df, columns)
    stats = model.estimators_stats_
    assert [s.model_index for s in stats] == [0, 1]
    assert sum(s.rows for s in stats) == len(y)
    assert all(abs(s.rows - len(y) / 2) < 60 for s in stats), [s.rows for s in stats]
    assert all(s.classes_seen == [0.0, 1.0] for s in stats)
    assert len({s.partition_id for s in stats}) == 2
    again = PartitionEnsemble(logistic(), n_estimators=2, random_state=4).fit(df, columns)
    assert [s.rows for s in again.estimators_stats_] == [s.rows for s in stats]
    np.testing.assert_array_equal(again.predict_proba(X), model.predict_proba(X))
    other = PartitionEnsemble(logistic(), n_estimators=2, random_state=5).fit(df, columns)
    assert [s.rows for s in other.estimators_stats_] != [s.rows for s in stats]


def test_shuffle_reads_in_place_only_a_task_per_model_and_few_models(
    spark, cancer_parquet, cancer, monkeypatch
):
    """More models than slots, or more than MAX_READERS_IN_PLACE, or a source Spark must
    read: the spread stage shuffles, and the in-place read is as accurate as it."""
    from pyspark.sql import functions as F

    from sparkdist.ensemble.fit import partitioning
    from sparkdist.ensemble.fit.driver import ReadInPlace, Shuffled, plan_fit

    X, y = cancer
    columns = [f"f{i}" for i in range(X.shape[1])]
    df = spark.read.parquet(cancer_parquet)

    def route(n_estimators, data=df):
        params = PartitionEnsemble(logistic(), n_estimators=n_estimators).get_params()
        return type(plan_fit(params, data, columns, "label")[1])

    assert route(2) is ReadInPlace
    assert route(3) is Shuffled  # 2 slots: a task trains more than one model
    assert route(2, df.filter(F.col("label") >= 0)) is Shuffled
    in_place = PartitionEnsemble(logistic(), n_estimators=2, random_state=6).fit(df, columns)
    monkeypatch.setattr(partitioning, "MAX_READERS_IN_PLACE", 1)
    assert route(2) is Shuffled
    shuffled = PartitionEnsemble(logistic(), n_estimators=2, random_state=6).fit(df, columns)
    for model in (in_place, shuffled):
        assert sum(s.rows for s in model.estimators_stats_) == len(y)
    assert abs(in_place.score(X, y) - shuffled.score(X, y)) <= 0.02
    assert in_place.score(X, y) > 0.95


def _numbered_row_files(directory, X, y) -> list[str]:
    """The rows in 3 Parquet files of row groups of 70, each with its number as the
    feature `row` (read back, it says which row came back); their URLs, sorted."""
    data = frame(X, y)
    data["row"] = np.arange(len(y), dtype=float)
    path = write_parquet_files(directory, data, n_files=3, row_group_size=70)
    return sorted(f"file://{path}/{name}" for name in os.listdir(path))


def test_parquet_row_ranges_cut_rows_evenly_across_row_groups(tmp_path, cancer):
    import pyarrow.parquet as pq

    from sparkdist.ensemble.fit.parquet_source import (
        ParquetSource,
        _row_groups,
        _row_ranges,
        read_split,
    )

    X, y = cancer
    urls = _numbered_row_files(tmp_path / "ranges", X, y)
    spec = FeatureSpec(n_features=2, feature_cols=("row", "f0"))
    _, groups = _row_groups(urls, spec, "label", True)
    assert len(groups) == 9  # 190 rows a file: 70 + 70 + 50
    for n in (1, 2, 4, 7, 600):
        splits = list(_row_ranges(groups, n))
        source = ParquetSource(tuple(splits), ("row", "f0"), False, "label", True)
        read = [
            np.concatenate(
                [X_[:, 0] for X_, _ in read_split(source, split, np.float64, 16)] or [[]]
            )
            for split in splits
        ]
        assert [len(r) for r in read] == [source.rows(i) for i in range(n)]
        assert max(map(len, read)) - min(map(len, read)) <= 1
        np.testing.assert_array_equal(np.concatenate(read), np.arange(len(y)))
    assert pq.read_metadata(urls[0][7:]).num_rows == 190


def test_parquet_reader_with_a_mask_decodes_only_the_kept_rows(tmp_path, cancer):
    """A shuffle read in place keeps a mask of the rows: each piece's matrix holds its
    kept rows in order, its labels every row (the checks count them all)."""
    from sparkdist.ensemble.fit.parquet_source import (
        ParquetSource,
        _row_groups,
        _row_ranges,
        read_split,
    )

    X, y = cancer
    urls = _numbered_row_files(tmp_path / "mask", X, y)
    _, groups = _row_groups(
        urls, FeatureSpec(n_features=2, feature_cols=("row", "f0")), "label", True
    )
    (split,) = _row_ranges(groups, 1)
    source = ParquetSource((split,), ("row", "f0"), False, "label", True)
    keep = np.random.default_rng(0).random(len(y)) < 0.3
    pieces = list(read_split(source, split, np.float32, 16, keep))
    assert [len(labels) for _, labels in pieces] == [
        len(lb) for _, lb in read_split(source, split, np.float32, 16)
    ]
    np.testing.assert_array_equal(
        np.concatenate([p[0] for p in pieces])[:, 0], np.flatnonzero(keep)
    )
    np.testing.assert_array_equal(np.concatenate([lb.to_numpy() for _, lb in pieces]), y)
    np.testing.assert_allclose(
        np.concatenate([p[0] for p in pieces])[:, 1], X[keep, 0].astype(np.float32)
    )


def test_only_plain_scans_of_read_columns_skip_spark(spark, tmp_path, cancer_parquet, cancer):
    """Anything that changes rows or computes a used column goes through Spark's reader."""
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F

    X, y = cancer
    columns = [f"f{i}" for i in range(X.shape[1])]
    df = spark.read.parquet(cancer_parquet)
    assert parquet_source_of(df.select(*columns, "label"), columns) is not None
    assert parquet_source_of(df.withColumn("extra", F.col("f0") * 2), columns) is not None

    refused = {
        "filter": df.filter(F.col("f0") > 0),
        "computed feature": df.withColumn("f0", F.col("f0") * 2),
        "renamed label": df.withColumnRenamed("label", "y").withColumnRenamed("f1", "label"),
        "limit": df.limit(100),
        "cache": df.cache(),
        "csv": None,
        "partition column": None,
    }
    csv_path = str(tmp_path / "csv")
    df.write.csv(csv_path, header=True)
    refused["csv"] = spark.read.csv(csv_path, header=True, inferSchema=True)
    by_label = str(tmp_path / "by_label")
    df.write.partitionBy("label").parquet(by_label)
    refused["partition column"] = spark.read.parquet(by_label)
    without_f1 = [c for c in columns if c != "f1"]
    for name, frame_ in refused.items():
        assert parquet_source_of(frame_, without_f1) is None, name

    vectors = str(tmp_path / "vectors")
    VectorAssembler(inputCols=columns, outputCol="features").transform(df).write.parquet(vectors)
    assert parquet_source_of(spark.read.parquet(vectors), "features") is None
    df.unpersist()

    # Data the direct path refused still trains, through Spark.
    model = PartitionEnsemble(logistic(), n_estimators=2, random_state=0).fit(
        refused["partition column"], columns
    )
    assert sum(s.rows for s in model.estimators_stats_) == len(y)


def test_parquet_array_column_and_bad_rows_checked_as_from_spark(spark, tmp_path, cancer):
    """A list column is read directly too, and the checks name the same problems."""
    X, y = cancer
    data = pd.DataFrame({"features": list(X), "label": y.astype(float)})
    good = spark.read.parquet(write_parquet_files(tmp_path / "good", data))
    assert parquet_source_of(good, "features") is not None
    model = PartitionEnsemble(logistic(), n_estimators=2, random_state=0).fit(good, "features")
    assert model.n_features_in_ == X.shape[1] and model.score(X, y) > 0.9

    null_vector = data.copy()
    null_vector.at[3, "features"] = None
    df = spark.read.parquet(write_parquet_files(tmp_path / "null_vector", null_vector))
    assert parquet_source_of(df, "features") is not None
    with pytest.raises(ValueError, match="null"):
        PartitionEnsemble(logistic(), n_estimators=2).fit(df, "features")

    nan_label = frame(X, y.astype(float))
    nan_label.loc[7, "label"] = np.nan
    df = spark.read.parquet(write_parquet_files(tmp_path / "nan_label", nan_label))
    columns = [f"f{i}" for i in range(X.shape[1])]
    assert parquet_source_of(df, columns) is not None
    with pytest.raises(ValueError, match="label"):
        PartitionEnsemble(logistic(), n_estimators=2).fit(df, columns)


def test_parquet_string_labels(spark, tmp_path, cancer):
    X, y = cancer
    data = frame(X[:, :6], np.where(y == 1, "benign", "malignant"))
    df = spark.read.parquet(write_parquet_files(tmp_path / "strings", data))
    columns = [f"f{i}" for i in range(6)]
    assert parquet_source_of(df, columns) is not None
    model = PartitionEnsemble(logistic(), n_estimators=2, random_state=0).fit(df, columns)
    assert list(model.classes_) == ["benign", "malignant"]
    assert (model.predict(X[:, :6]) == data["label"].to_numpy()).mean() > 0.85
