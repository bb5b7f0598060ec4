"""Python functions run on every partition of a DataFrame (`mapInArrow`), and the jobs
that collect their rows: the ensemble's spread and training reach Spark here.

A partition function takes an iterator of Arrow record batches and yields record batches
of the given schema (a Spark DDL string). `collect` runs the job under a description in
the Spark UI, with a progress display, and with the Arrow batches Spark sends the
functions capped in bytes (a row may be a large chunk of rows: uncapped, a task could
receive its whole partition as one batch and hold it twice).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from sparkdist.spark import jobs

logger = logging.getLogger(__name__)

PartitionFunction = Callable[[Iterator[Any]], Iterator[Any]]

_MAX_BATCH_BYTES = "spark.sql.execution.arrow.maxBytesPerBatch"
# Keys depend only on the partition count (Spark's hash is fixed), so one lookup per count.
_keys_by_count: dict[int, list[int]] = {}


def on_each_partition(df: Any, function: PartitionFunction, schema: str) -> Any:
    """`df` with each partition's rows replaced by what `function` yields for them."""
    return df.mapInArrow(function, schema)


def indexes(session: Any, n: int) -> Any:
    """A DataFrame of `n` partitions, partition i holding one row, the int i (`id`)."""
    return session.range(0, n, 1, n)


def on_each_index(session: Any, n: int, function: PartitionFunction, schema: str) -> Any:
    """`function` run in `n` tasks, task i given the batch of `indexes` partition i."""
    return on_each_partition(indexes(session, n), function, schema)


def hash_spread(df: Any, n_partitions: int, key: str, order: Sequence[str]) -> Any:
    """`df`'s rows moved (shuffled) to partition hash(`key`) % n, each sorted by `order`:
    a key from `partition_keys` reaches the partition it was found for."""
    from pyspark.sql import functions as F

    return df.repartition(n_partitions, F.col(key)).sortWithinPartitions(*order)


def coalesced(df: Any, n_partitions: int) -> Any:
    """`df` in at most `n_partitions` partitions, without a shuffle."""
    return df.coalesce(n_partitions)


def partition_keys(spark: Any, n_partitions: int) -> list[int]:
    """keys[j] is an int that Spark's hash partitioning into n_partitions sends to j.

    Found once per count by asking Spark to hash a range of candidates with the same
    `hash` (Murmur3, seed 42) that hash partitioning uses.
    """
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


def models_done(models_per_task: Callable[[int], int], n_models: int, n_stages: int) -> Callable:
    """A `jobs.watched` count of `n_models` models, not tasks, for a job whose last stage
    trains them: `models_per_task(k)` once k of its tasks finished, all once it finished.
    Nothing counts before `n_stages` stages were seen (the training stage is the last of
    them, the one with the highest id, also when adaptive execution runs a shuffle's map
    stage as a job of its own first)."""

    def count(stages: list[jobs.StageCount]) -> tuple[int, int]:
        if len(stages) < n_stages:
            return 0, n_models
        last = max(stages, key=lambda stage: stage.stage_id)
        done = n_models if last.done >= last.total else models_per_task(last.done)
        return done, n_models

    return count


def collect(
    df: Any,
    description: str,
    max_batch_bytes: int,
    unit: str = "tasks",
    count: Callable = jobs.tasks_done,
) -> list[Any]:
    """`df`'s rows, collected on the driver by a job described as `description`, its
    progress shown in `unit` as `count` reads the job's stages (see `jobs.watched`)."""
    session = df.sparkSession
    with (
        _arrow_batches_of_at_most(session, max_batch_bytes),
        jobs.described(session, description) as group,
        jobs.watched(session, group, description, unit=unit, count=count),
    ):
        return df.collect()


@contextlib.contextmanager
def _arrow_batches_of_at_most(spark: Any, n_bytes: int) -> Iterator[None]:
    """Cap the Arrow batches Spark sends Python at `n_bytes` while inside. A batch is cut
    at 10,000 rows by default; the setting is read when the job is planned, so it is
    restored as soon as the job has run."""
    previous = spark.conf.get(_MAX_BATCH_BYTES, None)
    if previous is not None and 0 < parse_bytes(previous) <= n_bytes:
        yield
        return
    spark.conf.set(_MAX_BATCH_BYTES, str(n_bytes))
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(_MAX_BATCH_BYTES)
        else:
            spark.conf.set(_MAX_BATCH_BYTES, previous)


def split_bytes(spark: Any, total_bytes: int, slots: int | None, least: int) -> int:
    """The bytes each of a scan's splits aims at: the data spread evenly over the task
    slots, at least `least` (Spark's spark.sql.files.maxPartitionBytes where the slots
    are unknown)."""
    if slots is None:
        return parse_bytes(spark.conf.get("spark.sql.files.maxPartitionBytes", None) or "128m")
    return max(least, math.ceil(total_bytes / max(1, slots)))


def parse_bytes(value: str) -> int:
    """A Spark size setting ("16m", "134217728", "1g") in bytes."""
    units = {"k": 2**10, "m": 2**20, "g": 2**30}
    text = value.strip().lower().removesuffix("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)
