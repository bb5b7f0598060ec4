"""Spread rows at random over exactly n partitions, one partition per model.

Each row draws a model index with `F.rand(seed)`. `repartition(n, index)` alone would hash
the index, and two indexes can hash to the same partition, leaving another partition idle
(with two task slots and two models, that halves the speedup). So each index is swapped
for a key that Spark's hash partitioner is known to send to the partition of the same
number: found once per fit by asking Spark itself to hash a range of candidates, with the
same `hash` (Murmur3, seed 42) that hash partitioning uses. The training function still
groups rows by model index, so results stay right even if the pinning did not hold.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

MODEL_INDEX_COL = "__sparkdist_model_index"
_KEY_COL = "__sparkdist_partition_key"
# Keys depend only on the partition count (Spark's hash is fixed), so one lookup per count.
_keys_by_count: dict[int, list[int]] = {}


def spread_rows(df: Any, n_partitions: int, seed: int) -> Any:
    """`df` plus a model index column, repartitioned so partition j holds index j."""
    from pyspark.sql import functions as F

    keys = partition_keys(df.sparkSession, n_partitions)
    key_of_index = F.array(*[F.lit(key) for key in keys])
    with_index = df.withColumn(
        MODEL_INDEX_COL, F.floor(F.rand(seed) * n_partitions).cast("int")
    ).withColumn(_KEY_COL, F.element_at(key_of_index, F.col(MODEL_INDEX_COL) + 1))
    return with_index.repartition(n_partitions, F.col(_KEY_COL)).drop(_KEY_COL)


def partition_keys(spark: Any, n_partitions: int) -> list[int]:
    """keys[j] is an int that Spark's hash partitioning into n_partitions sends to j."""
    from pyspark.sql import functions as F

    if n_partitions in _keys_by_count:
        return _keys_by_count[n_partitions]

    candidates = 64 * n_partitions
    while True:
        ids = F.col("id").cast("int")
        rows = (
            spark.range(candidates)
            .select(ids.alias("key"), F.pmod(F.hash(ids), F.lit(n_partitions)).alias("part"))
            .groupBy("part")
            .agg(F.min("key").alias("key"))
            .collect()
        )
        if len(rows) == n_partitions:
            keys = {row["part"]: row["key"] for row in rows}
            _keys_by_count[n_partitions] = [int(keys[part]) for part in range(n_partitions)]
            return _keys_by_count[n_partitions]
        candidates *= 4
        logger.debug("widening the search for partition keys to %d candidates", candidates)
