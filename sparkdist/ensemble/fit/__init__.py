"""How `PartitionEnsemble.fit` trains, in the order it happens.

1. `plan`: the parameters and the schema checked (`validation`), the training job planned.
2. `job`: the job built on its route (a shuffle, or each task's own rows) and run: the
   rows read (`parquet_source` for a plain Parquet scan), spread over the models in chunks
   (`partitioning`), each model fitted by its training task (`training`).
3. `assemble`: the data's totals checked (`validation`), the fitted model built.

The task-side modules (`parquet_source`, `partitioning`, `training`, `validation`) import
no scikit-learn at import time: a Python worker Spark started afresh would pay for it.
"""
