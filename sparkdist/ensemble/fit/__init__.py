"""How `PartitionEnsemble.fit` trains, in the order it happens.

1. `validation`: the parameters and the schema checked on the driver; later the data's
   totals (`DataReport`, `summarize`) checked in every training task and on the driver.
2. `parquet_source`: a plain Parquet scan's files cut into splits, read by pyarrow.
3. `partitioning`: the rows spread at random over the models, in chunks.
4. `training`: each training task fits its models and sends them back as rows.

These modules run in Spark tasks too: nothing here imports scikit-learn at import time.
"""
