"""The training function on its own (no Spark needed)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pyarrow as pa
import pytest
from ensemble_data import logistic

from sparkdist.ensemble import PartitionEnsemble
from sparkdist.ensemble.fit.driver import assemble_model
from sparkdist.ensemble.fit.partitioning import SpreadPlan, cut_chunks
from sparkdist.ensemble.fit.training import RESULT_SCHEMA, TrainingPlan, train_partition
from sparkdist.ensemble.fit.validation import DataReport, summarize
from sparkdist.ensemble.model.features import FeatureSpec
from sparkdist.ensemble.params import check_params

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
