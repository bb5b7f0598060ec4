"""Partition ensembles on a runtime's stack: training through its Arrow batches (pyarrow,
pandas), its scikit-learn, prediction through its pandas UDFs, and persistence through its
Spark ML writers and readers (pyspark 3.5's want a SparkContext, 4.x's take a session)."""

from __future__ import annotations

import numpy as np
from helpers import frame, pipeline_saved_and_loaded
from sklearn.tree import DecisionTreeClassifier

from sparkdist.ensemble import (
    PartitionEnsemble,
    PartitionEnsembleModel,
    SparkPartitionEnsemble,
    SparkPartitionEnsembleModel,
    load_model,
)


def test_fit_predict_on_spark_save_and_load(spark, cancer, cancer_df, tmp_path):
    data, df = frame(*cancer), cancer_df
    columns = [c for c in data.columns if c != "label"]
    model = PartitionEnsemble(
        DecisionTreeClassifier(max_depth=4), n_estimators=2, random_state=3
    ).fit(df)
    assert model.n_estimators_ == 2
    local = model.predict(data[columns].to_numpy())
    assert (local == data["label"]).mean() > 0.9
    on_spark = model.transform(df).select("label", "prediction", "probability").toPandas()
    np.testing.assert_array_equal(on_spark["prediction"].to_numpy(), local)

    model.save(str(tmp_path / "model"))
    loaded = load_model(str(tmp_path / "model"))
    assert isinstance(loaded, PartitionEnsembleModel)
    np.testing.assert_array_equal(loaded.predict(data[columns].to_numpy()), local)


def test_spark_ml_pipeline_fit_save_load(spark, cancer, tmp_path):
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler

    data = frame(*cancer)
    columns = [c for c in data.columns if c != "label"]
    df = spark.createDataFrame(data)
    stage = SparkPartitionEnsemble(
        estimator=DecisionTreeClassifier(max_depth=4), nEstimators=2, seed=5, probabilityCol="p"
    )
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=columns, outputCol="features"), stage])
    pipeline.write().save(str(tmp_path / "pipeline"))
    reloaded = Pipeline.load(str(tmp_path / "pipeline"))
    assert isinstance(reloaded.getStages()[1].getEstimator(), DecisionTreeClassifier)
    assert reloaded.getStages()[1].getNEstimators() == 2

    fitted = reloaded.fit(df)
    assert isinstance(fitted.stages[1], SparkPartitionEnsembleModel)
    before = fitted.transform(df).select("label", "prediction", "p").toPandas()
    assert (before["prediction"] == before["label"]).mean() > 0.9

    pipeline_saved_and_loaded(fitted, df, before, tmp_path / "fitted")
