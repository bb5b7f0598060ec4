# Databricks notebook source
# MAGIC %md
# MAGIC # 3. Partition ensembles: scikit-learn and XGBoost on a Spark DataFrame
# MAGIC
# MAGIC Big data, small models: `PartitionEnsemble` spreads the rows of a Spark DataFrame at
# MAGIC random over K partitions, trains one independent scikit-learn or XGBoost model per
# MAGIC partition on the executors, and combines them into one model that votes. No training
# MAGIC data passes through the driver.
# MAGIC
# MAGIC This notebook compares ensembles of K = 2, 4, 8 models with one model trained on all the
# MAGIC rows, plots accuracy against K, logs the best ensemble to MLflow and scores a Spark
# MAGIC DataFrame with it through `mlflow.pyfunc.spark_udf`.

# COMMAND ----------

import os
import tempfile

try:
    spark  # noqa: B018 - the notebook's SparkSession, on Databricks
except NameError:
    from sparkdist.spark.session import embedded_spark

    spark = embedded_spark(executors=2)

ON_DATABRICKS = "DATABRICKS_RUNTIME_VERSION" in os.environ
try:
    OUTPUT_DIR  # noqa: B018 - set by whoever runs this notebook (the tests do)
except NameError:
    OUTPUT_DIR = "/dbfs/tmp/sparkdist/03_ensembles" if ON_DATABRICKS else tempfile.mkdtemp()
os.makedirs(OUTPUT_DIR, exist_ok=True)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Data
# MAGIC
# MAGIC A generated two-class problem with 20 features. On Databricks you would start from a
# MAGIC table instead (`spark.table(...)`); the feature columns can be numeric columns, an array
# MAGIC column or a Spark ML vector column.

# COMMAND ----------

import pandas as pd
from sklearn.datasets import make_classification

x, y = make_classification(
    n_samples=24_000, n_features=20, n_informative=10, n_redundant=4, flip_y=0.02, random_state=0
)
features = [f"f{i}" for i in range(x.shape[1])]
data = pd.DataFrame(x, columns=features).assign(label=y)
train_pdf, test_pdf = data.iloc[:20_000], data.iloc[20_000:]
train_df = spark.createDataFrame(train_pdf).cache()
test_df = spark.createDataFrame(test_pdf)
print(f"{train_df.count()} training rows, {len(test_pdf)} test rows, {len(features)} features")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Ensembles of K models, and one model on all the rows

# COMMAND ----------

import time

from sklearn.tree import DecisionTreeClassifier
from xgboost import XGBClassifier

from sparkdist.ensemble import PartitionEnsemble

ESTIMATORS = {
    "scikit-learn decision tree": lambda: DecisionTreeClassifier(max_depth=10, random_state=0),
    "XGBoost": lambda: XGBClassifier(n_estimators=50, max_depth=5, n_jobs=1),
}
N_MODELS = [2, 4, 8]

rows, ensembles = [], {}
for name, make in ESTIMATORS.items():
    single = make().fit(train_pdf[features], train_pdf["label"])
    single_accuracy = float((single.predict(test_pdf[features]) == test_pdf["label"]).mean())
    rows.append({"estimator": name, "models": 1, "kind": "one model, all rows",
                 "accuracy": single_accuracy, "seconds": None})  # fmt: skip
    for k in N_MODELS:
        started = time.monotonic()
        model = PartitionEnsemble(estimator=make(), n_estimators=k, random_state=0).fit(
            train_df, features_col=features, label_col="label"
        )
        seconds = time.monotonic() - started
        ensembles[(name, k)] = model
        rows.append({"estimator": name, "models": k, "kind": "partition ensemble",
                     "accuracy": model.score(test_pdf[features], test_pdf["label"]),
                     "seconds": seconds})  # fmt: skip
results = pd.DataFrame(rows)
print(results.round(4).to_string(index=False))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Accuracy against the number of models

# COMMAND ----------

import matplotlib

if not ON_DATABRICKS:
    matplotlib.use("Agg")  # no display needed: the figure is saved as PNG
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(7, 4))
colors = ["tab:blue", "tab:orange"]
for (name, group), color in zip(results.groupby("estimator"), colors, strict=True):
    ensemble_rows = group[group["kind"] == "partition ensemble"]
    ax.plot(ensemble_rows["models"], ensemble_rows["accuracy"], "o-", color=color,
            label=f"{name}: ensemble of K")  # fmt: skip
    one = group[group["kind"] == "one model, all rows"]["accuracy"].iloc[0]
    ax.axhline(one, color=color, linestyle="--", label=f"{name}: one model, all rows")
ax.set_xscale("log", base=2)
ax.set_xticks(N_MODELS, [str(k) for k in N_MODELS])
ax.set_xlabel("models in the ensemble (K partitions)")
ax.set_ylabel("test accuracy")
ax.set_title("Partition ensembles vs one model on all the data")
ax.legend(fontsize=8)
fig.tight_layout()
plot_path = os.path.join(OUTPUT_DIR, "ensemble_accuracy.png")
fig.savefig(plot_path, dpi=100)
print(f"plot saved to {plot_path}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Log the XGBoost ensemble of 4 to MLflow
# MAGIC
# MAGIC `log_ensemble` logs it as an `mlflow.pyfunc` model (with a signature and pinned
# MAGIC requirements) plus a table of per-model statistics. On Databricks runs go to the
# MAGIC workspace's tracking server; locally to `mlflow.db` in the working directory.

# COMMAND ----------

import mlflow

from sparkdist.tracking import log_ensemble, use_default_tracking

if not ON_DATABRICKS:
    print(f"MLflow tracking URI: {use_default_tracking()}")
best = ensembles[("XGBoost", 4)]
with mlflow.start_run(run_name="partition-ensemble-xgboost") as run:
    mlflow.log_params({"estimator": "XGBClassifier", "n_estimators": best.n_estimators_})
    mlflow.log_metric("test_accuracy", best.score(test_pdf[features], test_pdf["label"]))
    mlflow.log_figure(fig, "ensemble_accuracy.png")
    info = log_ensemble(best, "ensemble")
print(f"run {run.info.run_id}; model {info.model_uri}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Batch scoring with `mlflow.pyfunc.spark_udf`
# MAGIC
# MAGIC Anyone with the model URI can score a Spark DataFrame; the model is loaded once per
# MAGIC executor Python worker.

# COMMAND ----------

from pyspark.sql import functions as F

predict = mlflow.pyfunc.spark_udf(spark, info.model_uri, env_manager="local", result_type="double")
scored = test_df.withColumn("prediction", predict(*features))
scored_path = os.path.join(OUTPUT_DIR, "scored.parquet")
# Spark names DBFS files dbfs:/..., Python /dbfs/...
spark_path = scored_path
if scored_path.startswith("/dbfs/"):
    spark_path = "dbfs:" + scored_path[len("/dbfs") :]
scored.select("label", "prediction").write.mode("overwrite").parquet(spark_path)
udf_accuracy = (
    spark.read.parquet(spark_path)
    .select(F.avg((F.col("label") == F.col("prediction")).cast("double")))
    .first()[0]
)
print(f"spark_udf batch scoring: accuracy {udf_accuracy:.4f}, predictions in {scored_path}")
