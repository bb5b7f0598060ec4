"""How `PartitionEnsemble.fit` trains, in the order it happens.

`driver` holds the fit's driver side top-down: the plan (the parameters checked by their
table, `ensemble.params`; the columns by `model.features`), the one Spark job that trains,
and the fitted model assembled from its rows. The job's tasks run the other modules: the
rows read (`parquet_source` for a plain Parquet scan), spread over the models in chunks
(`partitioning`), each model fitted by its training task (`training`), the data's totals
checked in the tasks and again on the driver (`validation`).

The task-side modules (`parquet_source`, `partitioning`, `training`, `validation`) import
no scikit-learn and no pyspark at import time: a Python worker Spark started afresh would
pay for it.
"""
