"""Bad input: clear errors before training, naming the column."""

from __future__ import annotations

import pandas as pd
import pytest
from ensemble_data import logistic
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler
from sklearn.svm import LinearSVC

from sparkdist.ensemble import PartitionEnsemble

# --- bad input: clear errors before training, naming the column ----------------------------


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
