"""Partition ensembles on real Spark (two executor JVMs), scikit-learn and XGBoost."""

from __future__ import annotations

import io
import json
import logging
import os
import sys

import cloudpickle
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from sklearn.base import clone
from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import StratifiedKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler
from sklearn.svm import LinearSVC
from sklearn.tree import DecisionTreeClassifier
from xgboost import XGBClassifier, XGBRegressor

from sparkdist.ensemble import (
    PartitionEnsemble,
    PartitionEnsembleModel,
    SparkPartitionEnsemble,
    SparkPartitionEnsembleModel,
    VersionMismatchError,
)
from sparkdist.ensemble.fit.driver import assemble_model
from sparkdist.ensemble.fit.partitioning import SpreadPlan, cut_chunks
from sparkdist.ensemble.fit.training import RESULT_SCHEMA, TrainingPlan, train_partition
from sparkdist.ensemble.fit.validation import DataReport, summarize
from sparkdist.ensemble.model.features import FeatureSpec
from sparkdist.ensemble.params import check_params

# Classes defined here (CountingModel) travel to the executors by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def logistic() -> object:
    return make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))


def xgb_classifier() -> XGBClassifier:
    return XGBClassifier(n_estimators=100, max_depth=3, learning_rate=0.3, n_jobs=1)


def frame(X: np.ndarray, y: np.ndarray, prefix: str = "f") -> pd.DataFrame:
    data = pd.DataFrame(X, columns=[f"{prefix}{i}" for i in range(X.shape[1])])
    data["label"] = y
    return data


def with_vector(spark, data: pd.DataFrame):
    """A Spark DataFrame with the feature columns and their VectorAssembler 'features'."""
    from pyspark.ml.feature import VectorAssembler

    columns = [c for c in data.columns if c != "label"]
    df = spark.createDataFrame(data)
    return VectorAssembler(inputCols=columns, outputCol="features").transform(df)


@pytest.fixture(scope="module")
def cancer():
    X, y = load_breast_cancer(return_X_y=True)
    return X, y


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return X, y


@pytest.fixture(scope="module")
def cancer_df(spark, cancer):
    X, y = cancer
    return with_vector(spark, frame(X, y)).cache()


@pytest.fixture(scope="module")
def cancer_model(cancer_df) -> PartitionEnsembleModel:
    return PartitionEnsemble(logistic(), n_estimators=4, random_state=7).fit(cancer_df)


@pytest.fixture(scope="module")
def digits_xgb_model(spark, digits) -> PartitionEnsembleModel:
    X, y = digits
    data = frame(X, y)
    df = spark.createDataFrame(data)
    columns = [c for c in data.columns if c != "label"]
    ensemble = PartitionEnsemble(xgb_classifier(), n_estimators=2, random_state=3)
    return ensemble.fit(df, features_col=columns, label_col="label")


# --- accuracy: the ensemble within 2 points of one model on all the data -----------------


def cross_validated_accuracy(spark, X, y, estimator, n_estimators: int, folds: int = 3):
    """Mean accuracy over stratified folds: (one model on all rows, the ensemble)."""
    single, ensemble = [], []
    splits = StratifiedKFold(folds, shuffle=True, random_state=0).split(X, y)
    for fold, (train, test) in enumerate(splits):
        single.append(clone(estimator).fit(X[train], y[train]).score(X[test], y[test]))
        df = with_vector(spark, frame(X[train], y[train]))
        model = PartitionEnsemble(estimator, n_estimators=n_estimators, random_state=fold).fit(
            df, features_col="features"
        )
        ensemble.append(model.score(X[test], y[test]))
    return float(np.mean(single)), float(np.mean(ensemble))


@pytest.mark.parametrize(
    ("dataset", "make_estimator", "n_estimators"),
    [
        ("cancer", logistic, 4),
        ("cancer", xgb_classifier, 2),
        ("digits", logistic, 4),
        ("digits", xgb_classifier, 2),
    ],
    ids=["cancer-logistic", "cancer-xgboost", "digits-logistic", "digits-xgboost"],
)
def test_accuracy_within_two_points_of_one_model(
    spark, request, dataset, make_estimator, n_estimators
):
    X, y = request.getfixturevalue(dataset)
    single, ensemble = cross_validated_accuracy(spark, X, y, make_estimator(), n_estimators)
    assert single > 0.9
    assert ensemble >= single - 0.02, (single, ensemble)


# --- how training is laid out ------------------------------------------------------------


def test_each_partition_trains_one_model_on_a_random_share(cancer_model, cancer):
    X, _ = cancer
    stats = cancer_model.estimators_stats_
    assert [s.model_index for s in stats] == [0, 1, 2, 3]
    # Four models on two task slots: two training tasks, each fitting two models in turn.
    assert [s.partition_id for s in stats] == [0, 1, 0, 1]
    assert sum(s.rows for s in stats) == len(X)
    assert all(abs(s.rows - len(X) / 4) < 0.25 * len(X) / 4 for s in stats)
    assert all(s.rows_fit == s.rows and s.fit_seconds > 0 for s in stats)
    assert all(s.classes_seen == [0.0, 1.0] for s in stats)
    assert cancer_model.n_estimators_ == 4 and cancer_model.n_features_in_ == X.shape[1]
    np.testing.assert_allclose(cancer_model.weights_, 0.25)


class _Terminal(io.StringIO):
    """stderr as a terminal: progress shows as a bar (tqdm's text)."""

    def isatty(self) -> bool:
        return True


def test_a_training_task_fits_its_models_in_turn(spark, cancer, monkeypatch):
    """Six models on two task slots: two training tasks, each receiving one model's rows
    after another and fitting each before the next one's rows are read. The progress bar
    counts models, not Spark tasks."""
    X, y = cancer
    df = spark.createDataFrame(frame(X, y))
    columns = [f"f{i}" for i in range(X.shape[1])]
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    model = PartitionEnsemble(xgb_classifier(), n_estimators=6, random_state=2).fit(df, columns)
    monkeypatch.undo()
    assert "sparkdist ensemble: 6 x XGBClassifier" in terminal.getvalue()
    assert "6/6 [" in terminal.getvalue() and "models/s]" in terminal.getvalue()
    stats = model.stats_frame()
    assert sorted(stats["partition_id"]) == [0, 0, 0, 1, 1, 1]
    for _, task in stats.groupby("partition_id"):
        task = task.sort_values("model_index")
        assert list(task["model_index"] % 2) == [task["partition_id"].iloc[0]] * 3
        # Each fit starts after the previous model of its task was fitted and loaded.
        ends = (task["fit_started"] + task["fit_seconds"]).to_numpy()[:-1]
        starts = task["fit_started"].to_numpy()[1:]
        assert (starts >= ends).all()
        assert task["task_started"].nunique() == 1
    assert stats["rows"].sum() == len(y) and model.score(X, y) > 0.95


def test_fit_reads_the_data_once(spark, cancer):
    """Checks, class discovery and training share one pass: the spread counts what it reads."""
    from pyspark.sql import functions as F
    from pyspark.sql.functions import udf

    X, y = cancer
    counter = spark.sparkContext.accumulator(0)

    @udf("double")
    def counted(label):
        counter.add(1)
        return label

    source = spark.createDataFrame(frame(X[:, :5], y)).withColumn("label", counted(F.col("label")))
    columns = [f"f{i}" for i in range(5)]
    model = PartitionEnsemble(DecisionTreeClassifier(max_depth=3), n_estimators=2).fit(
        source, features_col=columns
    )
    assert model.n_estimators_ == 2
    np.testing.assert_array_equal(model.classes_, [0.0, 1.0])
    assert counter.value == len(y)


# --- plain Parquet scans: pyarrow reads the files in the source tasks ---------------------


def write_parquet_files(path, data: pd.DataFrame, n_files: int = 2, row_group_size: int = 100):
    """`data` as `n_files` Parquet files of several row groups each, as pyarrow writes them."""
    import pyarrow.parquet as pq

    os.makedirs(path, exist_ok=True)
    for i, part in enumerate(np.array_split(np.arange(len(data)), n_files)):
        table = pa.Table.from_pandas(data.iloc[part], preserve_index=False)
        pq.write_table(
            table, os.path.join(path, f"part-{i}.parquet"), row_group_size=row_group_size
        )
    return str(path)


def parquet_source_of(df, features_col, label_col="label"):
    from sparkdist.ensemble.fit.parquet_source import find_parquet_source
    from sparkdist.ensemble.model.features import check_label_type, resolve_features
    from sparkdist.spark import session_slots

    spec = resolve_features(df.schema, features_col)
    numeric = check_label_type(df.schema, label_col, is_classifier=True)
    return find_parquet_source(df, spec, label_col, numeric, session_slots(df.sparkSession))


@pytest.fixture(scope="module")
def cancer_parquet(tmp_path_factory, cancer):
    X, y = cancer
    return write_parquet_files(tmp_path_factory.mktemp("cancer") / "data", frame(X, y))


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


# --- shuffle=False: each task trains its models on the rows it reads ---------------------


def test_without_shuffle_a_task_trains_its_models_on_its_own_rows(
    spark, tmp_path, cancer, monkeypatch
):
    """Sorted by label, the rows' order shows where each model's rows came from: with 2
    tasks, models 0 and 2 train on the first half of the rows, 1 and 3 on the second (all
    class 1 here: constant models, their outputs mapped onto the whole data's classes)."""
    X, y = cancer
    order = np.argsort(y, kind="stable")
    path = write_parquet_files(tmp_path / "sorted", frame(X[order], y[order]), row_group_size=50)
    columns = [f"f{i}" for i in range(X.shape[1])]
    df = spark.read.parquet(path)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    model = PartitionEnsemble(logistic(), n_estimators=4, random_state=2, shuffle=False).fit(
        df, columns
    )
    monkeypatch.undo()
    assert "4/4 [" in terminal.getvalue() and "models/s]" in terminal.getvalue()
    stats = model.estimators_stats_
    first_half = len(y) // 2  # 284 rows: 212 of class 0, then class 1
    assert sum(s.rows for s in stats[0::2]) == first_half
    assert sum(s.rows for s in stats[1::2]) == len(y) - first_half
    assert {s.partition_id for s in stats[0::2]} != {s.partition_id for s in stats[1::2]}
    assert all(s.classes_seen == [0.0, 1.0] and s.class_indices == [0, 1] for s in stats[0::2])
    assert all(s.classes_seen == [1.0] and s.class_indices == [1] for s in stats[1::2])
    assert all(s.single_class for s in stats[1::2])
    np.testing.assert_array_equal(model.classes_, [0.0, 1.0])
    proba = model.predict_proba(X)
    assert proba.shape == (len(y), 2)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)


def test_without_shuffle_random_order_data_is_as_accurate(spark, tmp_path, cancer):
    X, y = cancer
    order = np.random.default_rng(0).permutation(len(y))
    train, test = order[:400], order[400:]
    path = write_parquet_files(tmp_path / "random", frame(X[train], y[train]))
    columns = [f"f{i}" for i in range(X.shape[1])]
    df = spark.read.parquet(path)

    def fit(shuffle):
        ensemble = PartitionEnsemble(logistic(), n_estimators=4, random_state=3, shuffle=shuffle)
        model = ensemble.fit(df, columns)
        assert sum(s.rows for s in model.estimators_stats_) == len(train)
        assert model.params["shuffle"] is shuffle
        return model.score(X[test], y[test])

    shuffled, local = fit(True), fit(False)
    assert local > 0.93 and abs(local - shuffled) <= 0.03, (local, shuffled)


def test_without_shuffle_spark_read_rows_are_coalesced_into_one_part_per_task(spark, cancer):
    X, y = cancer
    df = with_vector(spark, frame(X, y)).repartition(5)  # Spark reads: not a plain scan
    model = PartitionEnsemble(logistic(), n_estimators=3, random_state=1, shuffle=False).fit(df)
    stats = model.estimators_stats_
    assert [s.model_index for s in stats] == [0, 1, 2]
    assert sum(s.rows for s in stats) == len(y)
    assert stats[0].partition_id == stats[2].partition_id != stats[1].partition_id
    assert model.score(X, y) > 0.95


def test_without_shuffle_bad_rows_are_named_after_the_tasks_checks(small_df):
    from pyspark.sql import functions as F

    df = small_df.withColumn("label", F.when(F.col("a") > 1, None).otherwise(F.col("label")))
    with pytest.raises(ValueError, match=r"label column 'label' has \d+ null or NaN.*dropna"):
        PartitionEnsemble(logistic(), n_estimators=2, shuffle=False).fit(df, ["a", "b"])
    with pytest.raises(ValueError, match=r"60 rows are too few for n_estimators=7"):
        PartitionEnsemble(logistic(), n_estimators=7, shuffle=False).fit(small_df, ["a", "b"])


def test_spark_ml_stage_passes_shuffle_through(cancer_df, cancer):
    X, y = cancer
    stage = SparkPartitionEnsemble(estimator=logistic(), nEstimators=2, seed=1, shuffle=False)
    assert stage.getShuffle() is False and SparkPartitionEnsemble().getShuffle() is True
    model = stage.fit(cancer_df)
    assert model.ensemble.params["shuffle"] is False
    assert sorted(s.rows for s in model.ensemble.estimators_stats_) == [284, 285]


def test_parquet_row_ranges_cut_rows_evenly_across_row_groups(tmp_path, cancer):
    import pyarrow.parquet as pq

    from sparkdist.ensemble.fit.parquet_source import (
        ParquetSource,
        _row_groups,
        _row_ranges,
        read_split,
    )

    X, y = cancer
    data = frame(X, y)
    data["row"] = np.arange(len(y), dtype=float)  # read as a feature: which row came back
    path = write_parquet_files(tmp_path / "ranges", data, n_files=3, row_group_size=70)
    urls = sorted(f"file://{path}/{name}" for name in os.listdir(path))
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
    data = frame(X, y)
    data["row"] = np.arange(len(y), dtype=float)
    path = write_parquet_files(tmp_path / "mask", data, n_files=3, row_group_size=70)
    urls = sorted(f"file://{path}/{name}" for name in os.listdir(path))
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


@pytest.mark.parametrize("make_estimator", [xgb_classifier, DecisionTreeClassifier])
def test_float32_features_change_nothing_for_models_that_train_on_float32(
    spark, cancer, make_estimator, monkeypatch
):
    """XGBoost and scikit-learn trees get float32 rows (half the shuffle and Arrow bytes);
    they cast to float32 themselves, so the models equal those trained from doubles."""
    X, y = cancer
    data = frame(X * 1.0001, y)  # values that float32 rounds
    df = spark.createDataFrame(data)
    columns = [c for c in data.columns if c != "label"]
    assert (
        FeatureSpec(len(columns), feature_cols=tuple(columns)).training_element(
            df.schema, make_estimator()
        )
        == "float"
    )
    fitted = PartitionEnsemble(make_estimator(), n_estimators=2, random_state=5).fit(df, columns)
    monkeypatch.setattr(FeatureSpec, "training_element", lambda *args: "double")
    doubles = PartitionEnsemble(make_estimator(), n_estimators=2, random_state=5).fit(df, columns)
    assert [s.partition_bytes for s in doubles.estimators_stats_] == [
        2 * s.partition_bytes - 4 * s.rows for s in fitted.estimators_stats_
    ]  # float32 features, int32 labels either way
    np.testing.assert_array_equal(fitted.predict_proba(X), doubles.predict_proba(X))


def test_float32_only_where_it_is_lossless(spark):
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T

    schema = T.StructType(
        [
            T.StructField("f", T.FloatType()),
            T.StructField("s", T.ShortType()),
            T.StructField("d", T.DoubleType()),
            T.StructField("i", T.IntegerType()),
            T.StructField("v", VectorUDT()),
            T.StructField("a", T.ArrayType(T.FloatType())),
        ]
    )

    def element(estimator, columns):
        if isinstance(columns, str):
            spec = FeatureSpec(1, features_col=columns)
        else:
            spec = FeatureSpec(len(columns), feature_cols=tuple(columns))
        return spec.training_element(schema, estimator)

    assert element(logistic(), ["f", "s"]) == "float"
    assert element(logistic(), "a") == "float"
    assert element(logistic(), ["f", "d"]) == "double"
    assert element(logistic(), ["i"]) == "double"  # ints beyond 2**24 are not float32
    assert element(logistic(), "v") == "double"
    assert element(xgb_classifier(), "v") == "float"
    assert element(make_pipeline(StandardScaler(), xgb_classifier()), "v") == "double"


def test_same_random_state_gives_the_same_ensemble(cancer_df, cancer_model, cancer):
    X, _ = cancer
    again = PartitionEnsemble(logistic(), n_estimators=4, random_state=7).fit(cancer_df)
    assert [s.rows for s in again.estimators_stats_] == [
        s.rows for s in cancer_model.estimators_stats_
    ]
    np.testing.assert_allclose(again.predict_proba(X), cancer_model.predict_proba(X))


def test_subspaces_bootstrap_hard_voting_and_validation_weights(cancer_df, cancer):
    X, y = cancer
    model = PartitionEnsemble(
        DecisionTreeClassifier(max_depth=4),
        n_estimators=3,
        max_samples=0.8,
        bootstrap=True,
        max_features=0.5,
        voting="hard",
        weights="validation",
        validation_fraction=0.2,
        random_state=1,
    ).fit(cancer_df)
    assert [len(f) for f in model.estimators_features_] == [15, 15, 15]
    assert len({tuple(f) for f in model.estimators_features_}) == 3
    for stats in model.estimators_stats_:
        assert stats.rows_validation == round(0.2 * stats.rows)
        assert stats.rows_fit == round(0.8 * (stats.rows - stats.rows_validation))
        assert 0.6 < stats.validation_score <= 1.0
    scores = np.array([s.validation_score for s in model.estimators_stats_])
    np.testing.assert_allclose(model.weights_, scores / scores.sum())
    proba = model.predict_proba(X)
    # Hard voting: probabilities are weighted vote shares, so each is a sum of weights.
    vote_sums = {round(float(sum(model.weights_[list(c)])), 9) for c in _subsets(3)}
    assert {round(float(p), 9) for p in proba.ravel()} <= vote_sums
    assert model.score(X, y) > 0.9


def _subsets(n: int):
    return [[i for i in range(n) if mask >> i & 1] for mask in range(2**n)]


# --- classes: known before training, aligned after -----------------------------------------


def test_partition_missing_a_class_still_predicts_aligned_probabilities(spark, digits):
    X, y = digits
    keep = (y != 9) | (np.cumsum(y == 9) <= 2)  # only two rows of class 9 remain
    df = spark.createDataFrame(frame(X[keep], y[keep]))
    columns = [f"f{i}" for i in range(X.shape[1])]
    model = PartitionEnsemble(xgb_classifier(), n_estimators=4, random_state=0).fit(
        df, features_col=columns
    )
    np.testing.assert_array_equal(model.classes_, np.arange(10.0))
    lacking = [s for s in model.estimators_stats_ if 9 not in s.class_indices]
    assert len(lacking) >= 2
    for stats in lacking:
        estimator = model.estimators_[stats.model_index]
        assert estimator.predict_proba(X[:5]).shape == (5, 9)
    proba = model.predict_proba(X)
    assert proba.shape == (len(X), 10)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-6)
    assert model.score(X[y != 9], y[y != 9]) > 0.9


def test_partition_with_a_single_class_gets_a_constant_model(spark, cancer, caplog):
    X, y = cancer
    keep = (y == 0) | (np.cumsum(y == 1) <= 1)  # a single row of class 1
    df = spark.createDataFrame(frame(X[keep], y[keep]))
    columns = [f"f{i}" for i in range(X.shape[1])]
    with caplog.at_level(logging.WARNING, logger="sparkdist.ensemble"):
        model = PartitionEnsemble(logistic(), n_estimators=3, random_state=0).fit(
            df, features_col=columns
        )
    single = [s for s in model.estimators_stats_ if s.single_class]
    assert len(single) >= 2 and all(s.classes_seen == [0.0] for s in single)
    assert "single class" in caplog.text
    proba = model.predict_proba(X[:10])
    assert proba.shape == (10, 2)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)


def test_string_labels(spark, cancer):
    X, y = cancer
    names = np.where(y == 1, "benign", "malignant")
    data = frame(X, names)
    df = spark.createDataFrame(data)
    columns = [c for c in data.columns if c != "label"]
    model = PartitionEnsemble(logistic(), n_estimators=2, random_state=0).fit(
        df, features_col=columns
    )
    assert list(model.classes_) == ["benign", "malignant"]
    assert model.score(data, names) > 0.95
    predicted = model.transform(df).select("prediction").toPandas()["prediction"]
    np.testing.assert_array_equal(predicted.to_numpy(), model.predict(data))


# --- prediction on Spark equals prediction on pandas ---------------------------------------


def test_transform_equals_pandas_predict_vector_column(cancer_model, cancer_df):
    out = cancer_model.transform(cancer_df).select("features", "prediction", "probability")
    result = out.toPandas()
    X = np.stack([v.toArray() for v in result["features"]])
    np.testing.assert_array_equal(result["prediction"].to_numpy(), cancer_model.predict(X))
    probability = np.stack([v.toArray() for v in result["probability"]])
    np.testing.assert_allclose(probability, cancer_model.predict_proba(X), rtol=1e-12)
    # A pandas frame with the vector column predicts the same (as MLflow's pyfunc would).
    np.testing.assert_array_equal(cancer_model.predict(result), cancer_model.predict(X))


def test_transform_equals_pandas_predict_columns(spark, digits_xgb_model, digits):
    X, y = digits
    data = frame(X, y)
    result = digits_xgb_model.transform(spark.createDataFrame(data)).toPandas()
    np.testing.assert_array_equal(
        result["prediction"].to_numpy(), digits_xgb_model.predict(data).astype(float)
    )
    probability = np.stack([v.toArray() for v in result["probability"]])
    np.testing.assert_allclose(probability, digits_xgb_model.predict_proba(data), rtol=1e-6)


class CountingModel:
    """Wraps a fitted model; every unpickling adds 1 to a Spark accumulator."""

    def __init__(self, inner, counter) -> None:
        self.inner = inner
        self.counter = counter

    def __setstate__(self, state) -> None:
        self.__dict__.update(state)
        self.counter.add(1)

    def predict_proba(self, X):
        return self.inner.predict_proba(X)


def test_transform_unpickles_the_models_once_per_task_not_per_batch(spark, cancer_model, cancer_df):
    counter = spark.sparkContext.accumulator(0)
    model = cloudpickle.loads(cloudpickle.dumps(cancer_model))
    model.estimators_[0] = CountingModel(model.estimators_[0], counter)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "20")
    try:
        rows = model.transform(cancer_df).select("prediction").collect()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    tasks = cancer_df.rdd.getNumPartitions()
    assert len(rows) == cancer_df.count() and len(rows) / 20 > 3 * tasks
    assert counter.value == tasks


def test_regression_matches_one_model_and_transform_equals_predict(spark):
    X, y = load_diabetes(return_X_y=True)
    data = frame(X, y)
    columns = [c for c in data.columns if c != "label"]
    df = spark.createDataFrame(data)
    single = Ridge(alpha=0.1).fit(X, y).score(X, y)
    model = PartitionEnsemble(Ridge(alpha=0.1), n_estimators=3, random_state=0).fit(
        df, features_col=columns
    )
    assert not hasattr(model, "classes_")
    assert model.score(data, y) >= single - 0.02
    result = model.transform(df).toPandas()
    assert "probability" not in result.columns
    np.testing.assert_allclose(result["prediction"], model.predict(data), rtol=1e-9)
    boosted = PartitionEnsemble(
        XGBRegressor(n_estimators=50, max_depth=2, n_jobs=1),
        n_estimators=2,
        weights="validation",
        random_state=0,
    ).fit(df, features_col=columns)
    assert boosted.score(data, y) > 0.4
    assert all(s.validation_score is not None for s in boosted.estimators_stats_)


# --- save and load -------------------------------------------------------------------------


def test_save_load_local_round_trip(tmp_path, cancer_model, cancer):
    X, _ = cancer
    path = str(tmp_path / "ensemble")
    cancer_model.save(path)
    manifest = json.loads((tmp_path / "ensemble" / "manifest.json").read_text())
    assert manifest["versions"]["scikit-learn"]
    assert [e["file"] for e in manifest["estimators"]] == [
        f"estimators/0000{i}.pkl" for i in range(4)
    ]
    loaded = PartitionEnsembleModel.load(path)
    np.testing.assert_array_equal(loaded.predict_proba(X), cancer_model.predict_proba(X))
    assert [s.to_dict() for s in loaded.estimators_stats_] == [
        s.to_dict() for s in cancer_model.estimators_stats_
    ]
    with pytest.raises(FileExistsError, match="overwrite=True"):
        cancer_model.save(path)
    cancer_model.save(path, overwrite=True)


def test_save_through_spark_filesystem_xgboost_json(spark, tmp_path, digits_xgb_model, digits):
    X, _ = digits
    uri = "file://" + str(tmp_path / "xgb")
    digits_xgb_model.save(uri, spark=spark)  # through Hadoop's FileSystem API
    files = sorted(f for f in os.listdir(tmp_path / "xgb" / "estimators") if f[0] != ".")
    assert files == ["00000.json", "00001.json"]
    booster = XGBClassifier()
    booster.load_model(str(tmp_path / "xgb" / "estimators" / "00000.json"))
    np.testing.assert_allclose(
        booster.predict_proba(X), digits_xgb_model.estimators_[0].predict_proba(X), rtol=1e-6
    )
    for loaded in (
        PartitionEnsembleModel.load(uri, spark=spark),  # through Spark
        PartitionEnsembleModel.load(str(tmp_path / "xgb")),  # plain local read
    ):
        np.testing.assert_allclose(
            loaded.predict_proba(X), digits_xgb_model.predict_proba(X), rtol=1e-6
        )


def test_load_refuses_another_sklearn_version(tmp_path, cancer_model):
    path = tmp_path / "ensemble"
    cancer_model.save(str(path))
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["versions"]["scikit-learn"] = "0.24.2"
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(VersionMismatchError, match=r"scikit-learn 0\.24\.2.*scikit-learn==0\.24"):
        PartitionEnsembleModel.load(str(path))


def test_load_missing_path_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="no saved partition ensemble"):
        PartitionEnsembleModel.load(str(tmp_path / "nothing"))


def test_remote_scheme_without_spark_is_clear(cancer_model, monkeypatch):
    from pyspark.sql import SparkSession

    monkeypatch.setattr(SparkSession, "getActiveSession", classmethod(lambda cls: None))
    with pytest.raises(ValueError, match="'hdfs' filesystem.*SparkSession"):
        cancer_model.save("hdfs://namenode:8020/models/x")


def test_model_pickles_for_mlflow(cancer_model, cancer):
    X, _ = cancer
    frame_in = pd.DataFrame({"features": list(X)})
    restored = cloudpickle.loads(cloudpickle.dumps(cancer_model))
    np.testing.assert_array_equal(restored.predict(frame_in), cancer_model.predict(X))


# --- Spark ML pair inside a Pipeline -------------------------------------------------------


def test_spark_ml_pipeline_fit_save_load(spark, tmp_path, cancer):
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import VectorAssembler

    X, y = cancer
    data = frame(X, y)
    columns = [c for c in data.columns if c != "label"]
    df = spark.createDataFrame(data)
    stage = SparkPartitionEnsemble(
        estimator=xgb_classifier(), nEstimators=2, seed=5, probabilityCol="p"
    )
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=columns, outputCol="features"), stage])
    pipeline.write().save(str(tmp_path / "pipeline"))
    reloaded = Pipeline.load(str(tmp_path / "pipeline"))
    assert isinstance(reloaded.getStages()[1].getEstimator(), XGBClassifier)
    assert reloaded.getStages()[1].getNEstimators() == 2

    fitted = reloaded.fit(df)
    ensemble_stage = fitted.stages[1]
    assert isinstance(ensemble_stage, SparkPartitionEnsembleModel)
    assert ensemble_stage.ensemble.n_estimators_ == 2
    before = fitted.transform(df).select("label", "prediction", "p").toPandas()
    assert (before["prediction"] == before["label"]).mean() > 0.95

    fitted.save(str(tmp_path / "model"))
    loaded = PipelineModel.load(str(tmp_path / "model"))
    assert isinstance(loaded.stages[1], SparkPartitionEnsembleModel)
    assert loaded.stages[1].getProbabilityCol() == "p"
    after = loaded.transform(df).select("label", "prediction", "p").toPandas()
    np.testing.assert_array_equal(after["prediction"], before["prediction"])
    np.testing.assert_allclose(
        np.stack([v.toArray() for v in after["p"]]),
        np.stack([v.toArray() for v in before["p"]]),
    )
    np.testing.assert_array_equal(
        after["prediction"], loaded.stages[1].ensemble.predict(data[columns])
    )


def test_one_parameter_table_for_sklearn_and_spark_ml():
    import inspect

    from sparkdist.ensemble.params import ENSEMBLE_PARAMS

    spark_names = {
        "estimator": "estimator",
        "n_estimators": "nEstimators",
        "max_samples": "maxSamples",
        "bootstrap": "bootstrap",
        "max_features": "maxFeatures",
        "voting": "voting",
        "weights": "weights",
        "validation_fraction": "validationFraction",
        "random_state": "seed",
        "shuffle": "shuffle",
    }
    defaults = {
        "estimator": None,
        "n_estimators": 8,
        "max_samples": 1.0,
        "bootstrap": False,
        "max_features": 1.0,
        "voting": "soft",
        "weights": "uniform",
        "validation_fraction": None,
        "random_state": None,
        "shuffle": True,
    }
    assert {p.name: p.spark_name for p in ENSEMBLE_PARAMS} == spark_names
    assert {p.name: p.default for p in ENSEMBLE_PARAMS} == defaults
    # scikit-learn's signature (get_params reads it): the table's names, order and defaults.
    sklearn = inspect.signature(PartitionEnsemble).parameters
    assert list(sklearn) == [p.name for p in ENSEMBLE_PARAMS]
    assert {name: p.default for name, p in sklearn.items()} == defaults
    assert PartitionEnsemble().get_params() == defaults

    # Spark ML: a Param, a getter and a default per entry; the keyword signature of
    # __init__ and setParams names every Param with its default.
    stage = SparkPartitionEnsemble()
    for param in ENSEMBLE_PARAMS:
        spark_param = stage.getParam(param.spark_name)
        assert spark_param.doc == param.doc
        assert stage.isDefined(spark_param) is (param.default is not None)
        getter = "get" + param.spark_name[0].upper() + param.spark_name[1:]
        assert getattr(stage, getter)() == param.default
    for method in (SparkPartitionEnsemble, SparkPartitionEnsemble.setParams):
        keywords = dict(inspect.signature(method).parameters)
        keywords.pop("self", None)
        assert {p.kind for p in keywords.values()} == {inspect.Parameter.KEYWORD_ONLY}
        assert set(keywords) == {p.name for p in stage.params}
        for param in stage.params:
            default = stage.getOrDefault(param) if stage.isDefined(param) else None
            assert keywords[param.name].default == default, param.name
    assert [stage.getBootstrap(), stage.getShuffle()] == [False, True]  # bools, not 0/1
    assert type(stage.getNEstimators()) is int and type(stage.getMaxSamples()) is float


def test_spark_ml_stage_takes_its_params_by_keyword_only():
    stage = SparkPartitionEnsemble(nEstimators=3, seed=2**40 + 5, featuresCols=["a", "b"])
    assert stage._input_kwargs == {"nEstimators": 3, "seed": 2**40 + 5, "featuresCols": ["a", "b"]}
    assert (stage.getNEstimators(), stage.getSeed(), stage.getFeaturesCols()) == (
        3,
        2**40 + 5,
        ["a", "b"],
    )
    assert stage._ensemble_params()["random_state"] == 5  # a Spark ML seed cut to 31 bits
    assert stage.setParams(maxSamples=0.5) is stage and stage.getMaxSamples() == 0.5
    assert stage._input_kwargs == {"maxSamples": 0.5} and stage.getNEstimators() == 3
    assert stage._json_param_map() == {
        "nEstimators": 3,
        "seed": 2**40 + 5,
        "featuresCols": ["a", "b"],
        "maxSamples": 0.5,
    }
    with pytest.raises(TypeError, match="unexpected keyword argument 'nEstimator'"):
        SparkPartitionEnsemble(nEstimator=3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_estimators'"):
        stage.setParams(n_estimators=3)
    with pytest.raises(TypeError, match="forces keyword arguments"):
        SparkPartitionEnsemble(logistic())


# --- bad input: clear errors before training, naming the column ----------------------------


@pytest.fixture(scope="module")
def small_df(spark):
    rng = np.random.default_rng(0)
    data = pd.DataFrame(rng.normal(size=(60, 3)), columns=["a", "b", "c"])
    data["label"] = (data["a"] > 0).astype(float)
    data["name"] = "x"
    return spark.createDataFrame(data)


def test_null_label_is_named(small_df):
    from pyspark.sql import functions as F

    df = small_df.withColumn("label", F.when(F.col("a") > 1, None).otherwise(F.col("label")))
    with pytest.raises(ValueError, match=r"label column 'label' has \d+ null or NaN.*dropna"):
        PartitionEnsemble(logistic(), n_estimators=2).fit(df, features_col=["a", "b"])


def test_nan_label_is_named(small_df):
    from pyspark.sql import functions as F

    df = small_df.withColumn(
        "target", F.when(F.col("a") > 1, F.lit(float("nan"))).otherwise(F.col("label"))
    )
    with pytest.raises(ValueError, match="label column 'target' has .* null or NaN"):
        PartitionEnsemble(Ridge(), n_estimators=2).fit(df, ["a", "b"], label_col="target")


def test_non_numeric_feature_is_named(small_df):
    with pytest.raises(ValueError, match="feature column 'name' has type string.*VectorAssembler"):
        PartitionEnsemble(logistic(), n_estimators=2).fit(small_df, features_col=["a", "name"])


def test_missing_column_is_named(small_df):
    with pytest.raises(ValueError, match=r"feature column\(s\) \['features'\] not in"):
        PartitionEnsemble(logistic(), n_estimators=2).fit(small_df)
    with pytest.raises(ValueError, match=r"label column\(s\) \['y'\] not in"):
        PartitionEnsemble(logistic(), n_estimators=2).fit(small_df, ["a"], label_col="y")


def test_too_few_rows_for_n_estimators(small_df):
    with pytest.raises(ValueError, match=r"60 rows are too few for n_estimators=7.*<= 6"):
        PartitionEnsemble(logistic(), n_estimators=7).fit(small_df, features_col=["a", "b"])


def test_vectors_of_different_sizes_are_refused(spark):
    df = spark.createDataFrame(
        [([1.0, 2.0], 0.0)] * 15 + [([1.0], 1.0)] * 15, "features array<double>, label double"
    )
    with pytest.raises(ValueError, match="'features' holds vectors of different sizes"):
        PartitionEnsemble(logistic(), n_estimators=2).fit(df)


def test_continuous_label_for_a_classifier_is_refused(spark):
    df = spark.range(1100).selectExpr("cast(id as double) as a", "id / 7.0 as label")
    with pytest.raises(ValueError, match="more than 1000 distinct values.*Use a regressor"):
        PartitionEnsemble(logistic(), n_estimators=2).fit(df, features_col=["a"])


def test_null_feature_vector_is_named(spark):
    df = spark.createDataFrame(
        [([1.0, 2.0], 0.0)] * 15 + [(None, 1.0)] * 15, "v array<double>, label double"
    )
    with pytest.raises(ValueError, match="feature column 'v' is null in 15 row"):
        PartitionEnsemble(logistic(), n_estimators=2).fit(df, features_col="v")


def test_bad_data_trains_no_model(spark, small_df):
    """Every training task checks the whole data's totals before it fits."""
    from pyspark.sql import functions as F

    counter = spark.sparkContext.accumulator(0)

    def counted(X):
        counter.add(1)
        return X

    def counting_model():  # the transformer runs once per fit
        return make_pipeline(FunctionTransformer(counted), LogisticRegression())

    df = small_df.withColumn("label", F.when(F.col("a") > 1.5, None).otherwise(F.col("label")))
    with pytest.raises(ValueError, match="null or NaN"):
        PartitionEnsemble(counting_model(), n_estimators=2).fit(df, features_col=["a", "b"])
    assert counter.value == 0
    PartitionEnsemble(counting_model(), n_estimators=2).fit(small_df, features_col=["a", "b"])
    assert counter.value == 2


def test_single_class_data_is_refused(small_df):
    from pyspark.sql import functions as F

    with pytest.raises(ValueError, match="single class"):
        PartitionEnsemble(logistic(), n_estimators=2).fit(
            small_df.withColumn("label", F.lit(1.0)), ["a", "b"]
        )


def test_string_label_for_a_regressor_is_refused(small_df):
    with pytest.raises(ValueError, match="label column 'name' has type string.*numeric"):
        PartitionEnsemble(Ridge(), n_estimators=2).fit(small_df, ["a"], label_col="name")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"estimator": None}, "scikit-learn-compatible"),
        ({"estimator": StandardScaler()}, "fit and predict"),
        ({"n_estimators": 0}, "n_estimators must be an integer >= 1"),
        ({"max_samples": 1.5}, r"max_samples .* in \(0, 1\]"),
        ({"max_features": 0.0}, "max_features must be"),
        ({"voting": "soft", "estimator": LinearSVC()}, "voting='hard'"),
        ({"voting": "maybe"}, "voting must be one of"),
        ({"weights": "validation", "validation_fraction": 0.0}, "validation_fraction > 0"),
        ({"random_state": -1}, "random_state must be >= 0"),
        ({"shuffle": "no"}, "shuffle must be True or False"),
    ],
)
def test_bad_parameters_fail_before_any_spark_job(small_df, params, message):
    settings = {"estimator": logistic(), "n_estimators": 2, **params}
    with pytest.raises(ValueError, match=message):
        PartitionEnsemble(**settings).fit(small_df, features_col=["a", "b"])


def test_fit_takes_a_spark_dataframe():
    with pytest.raises(TypeError, match="Spark DataFrame"):
        PartitionEnsemble(logistic()).fit(pd.DataFrame({"a": [1.0]}))


# --- the training function on its own (no Spark needed) ------------------------------------


def _spread_table(X, y, n_models: int, spec: FeatureSpec) -> pa.Table:
    """What the spread sends to the training tasks, cut from two source batches, in the
    order a training partition receives it."""
    features = pa.array(list(X), pa.list_(pa.float64()))
    batch = pa.RecordBatch.from_arrays([features, pa.array(y, pa.float64())], ["x", "y"])
    plan = SpreadPlan(
        keys=tuple(range(100, 100 + n_models)),
        n_models=n_models,
        seed=0,
        n_features=X.shape[1],
        element="double",
        is_classifier=True,
        label_is_numeric=True,
    )
    half = len(y) // 2
    table = pa.Table.from_batches(
        list(cut_chunks(plan, iter([batch.slice(0, half), batch.slice(half)])))
    )
    # As spread() sorts each partition: reports (model index -1) first, then model by model.
    return table.sort_by(
        [("model_index", "ascending"), ("source", "ascending"), ("piece", "ascending")]
    )


def test_outside_a_task_partition_id_is_minus_one_and_a_source_is_zero(cancer):
    from sparkdist.spark.task import partition_id

    X, y = cancer
    table = _spread_table(X, y, 2, FeatureSpec(X.shape[1], features_col="x"))
    assert partition_id() == -1
    assert set(table.column("source").to_pylist()) == {0}


def test_rows_grow_in_place_into_one_matrix():
    from sparkdist.ensemble.fit.training import _Rows

    X = np.arange(60, dtype=np.float32).reshape(20, 3)
    rows = _Rows(np.float32, 0)  # a vector column: the first chunk gives the width
    for start in (0, 5, 12):
        stop = {0: 5, 5: 12, 12: 20}[start]
        data = np.frombuffer(X[start:stop].tobytes(), dtype=np.uint8)
        rows.add(data, pa.array(np.arange(start, stop) % 2, pa.float64()))
    rows.add(np.zeros(8, np.uint8), pa.array([1.0]))  # 2 values in a row of 3: dropped
    matrix, labels = rows.arrays(np.array([0.0, 1.0]))
    assert matrix.dtype == np.float32 and labels.dtype == np.int32  # kept, not widened
    np.testing.assert_array_equal(matrix, X)
    np.testing.assert_array_equal(labels, np.arange(20) % 2)


def test_training_function_skips_empty_partitions_and_driver_warns(cancer, caplog):
    X, y = cancer
    spec = FeatureSpec(n_features=X.shape[1], feature_cols=tuple(f"f{i}" for i in range(30)))
    settings = check_params(
        PartitionEnsemble(logistic(), n_estimators=3, random_state=0).get_params()
    )
    plan = TrainingPlan(
        settings=settings,
        features=spec,
        label_col="label",
        label_is_numeric=True,
        element="double",
    )
    table = _spread_table(X, y, 3, spec)
    assert list(train_partition(plan, iter([]))) == []
    # Partition 1 holds only the source tasks' reports: it trains nothing. Partition 0 also
    # gets model 2's chunks (as if hash pinning had failed) and trains both.
    key = table.column("key").to_numpy()
    empty = table.filter(pa.array((key == 101) & table.column("report").is_valid().to_numpy()))
    both = table.filter(pa.array(key != 101))
    results = [
        batch.to_pylist()[0]
        for part in (both, empty)
        for batch in train_partition(plan, iter(part.to_batches(max_chunksize=7)))
    ]
    assert [row["model_index"] for row in results] == [0, 2, -1]
    assert results[0].keys() == {f.split()[0] for f in RESULT_SCHEMA.split(", ")}
    report = DataReport.from_dict(json.loads(results[2]["report"]))
    assert report.rows == len(y) and report.classes == {0.0, 1.0}
    summary = summarize(report, spec, "label", settings, True)
    with caplog.at_level(logging.WARNING, logger="sparkdist.ensemble"):
        model = assemble_model(results[:2], summary, settings, [np.arange(30)] * 3, {})
    assert "models [1] got no rows and were skipped" in caplog.text
    assert model.n_estimators_ == 2 and model.score(X, y) > 0.95


def test_training_tasks_refuse_bad_data_before_fitting(cancer):
    X, y = cancer
    y = y.astype(float)
    y[:3] = np.nan
    spec = FeatureSpec(n_features=X.shape[1], feature_cols=tuple(f"f{i}" for i in range(30)))
    settings = check_params(
        PartitionEnsemble(logistic(), n_estimators=2, random_state=0).get_params()
    )
    plan = TrainingPlan(settings, spec, "label", True, "double")
    results = [
        batch.to_pylist()[0]
        for batch in train_partition(plan, iter(_spread_table(X, y, 2, spec).to_batches()))
    ]
    assert [row["model_index"] for row in results] == [-1]
    report = DataReport.from_dict(json.loads(results[0]["report"]))
    with pytest.raises(ValueError, match="label column 'label' has 3 null or NaN"):
        summarize(report, spec, "label", settings, True)


def test_progress_counts_models_as_their_training_tasks_finish():
    """10 models on 4 training tasks train 3, 3, 2, 2 models: k finished tasks count at
    least the models of the k smallest; nothing counts while only the spread stage ran
    (its own job under adaptive execution), and all once the training stage finished."""
    from sparkdist.ensemble.fit.driver import _models_in_tasks, models_done
    from sparkdist.spark.jobs import StageCount

    assert [_models_in_tasks(10, 4, k) for k in range(5)] == [0, 2, 4, 7, 10]
    count = models_done(lambda k: _models_in_tasks(10, 4, k), 10, n_stages=2)
    assert count([StageCount(3, 20, 20)]) == (0, 10)
    assert count([StageCount(3, 20, 20), StageCount(4, 1, 4)]) == (2, 10)
    assert count([StageCount(3, 20, 20), StageCount(4, 4, 4)]) == (10, 10)
    # Fewer tasks than planned (shuffle=False coalesced into fewer parts): done is done.
    fewer = models_done(lambda k: _models_in_tasks(10, 4, k), 10, n_stages=1)
    assert fewer([StageCount(0, 2, 2)]) == (10, 10)
