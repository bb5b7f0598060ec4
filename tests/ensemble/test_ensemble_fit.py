"""Fitting a partition ensemble on real Spark (two executor JVMs): its accuracy against one
model, how training is laid out over the tasks, shuffle=False, float32 features, the
random state and the sampling options, and the classes."""

from __future__ import annotations

import io
import logging
import sys

import numpy as np
import pytest
from ensemble_data import logistic, write_parquet_files, xgb_classifier
from helpers import frame, with_vector
from sklearn.base import clone
from sklearn.model_selection import StratifiedKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.tree import DecisionTreeClassifier

from sparkdist.ensemble import PartitionEnsemble, SparkPartitionEnsemble
from sparkdist.ensemble.model.features import FeatureSpec

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
