# Databricks notebook source
# MAGIC %md
# MAGIC # sparkdist quickstart: HorovodRunner on Spark
# MAGIC
# MAGIC Train a small PyTorch model on scikit-learn's digits with DistributedDataParallel:
# MAGIC first on the driver (`np=-2`, for debugging), then on the cluster (`np=2`).
# MAGIC On Databricks, install sparkdist on the cluster (see `init_scripts/`); locally this
# MAGIC notebook starts an embedded Spark with two executors.

# COMMAND ----------

try:
    spark  # noqa: B018 - the notebook's SparkSession, on Databricks
except NameError:
    from sparkdist.session import embedded_spark

    spark = embedded_spark(executors=2)

from sparkdist import HorovodRunner
from sparkdist.demos.digits import train_digits_ddp

# COMMAND ----------

# MAGIC %md
# MAGIC ## 1. Debug on the driver: two ranks as local processes

# COMMAND ----------

local = HorovodRunner(np=-2).run(train_digits_ddp, epochs=5)
print(f"driver-local accuracy: {local['accuracy']:.4f}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## 2. The same function on the cluster: one barrier task per rank

# COMMAND ----------

runner = HorovodRunner(np=2)
result = runner.run(train_digits_ddp, epochs=15)
print(f"cluster accuracy: {result['accuracy']:.4f} in {runner.last_job.wall_time_s:.1f}s "
      f"({runner.last_job.launcher} launcher)")
assert result["accuracy"] >= 0.9
