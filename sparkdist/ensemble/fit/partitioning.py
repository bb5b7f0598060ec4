"""Spread rows at random over n_estimators models, in chunks, to as many training tasks
as there are task slots.

The spread runs in Python on the source's own partitions (`mapInArrow`): each batch of
rows gets a random model index per row, and the rows of each index leave as one chunk,
a single binary value holding their feature matrix, plus their labels. Spark's shuffle
then moves a few large values instead of every row, and the training task copies each
chunk into its matrix without per-row work. Each source task also sends every training
partition a report of what it read (rows, bad labels, vector sizes, classes), so every
training task knows the whole data's totals before it fits: the input checks and a
classifier's class discovery need no pass of their own.

Model j trains in partition j % P, P = min(n_estimators, task slots): a Python task costs
about 0.1 s of its slot before it reads a row, so K tasks for K models on a few slots
spent seconds between fits. Each partition is sorted by model, so its task receives one
model's rows after another and fits each as soon as they are in, holding one model's rows
at a time. A partition p is reached with a key Spark's hash partitioner is known to send
there (`repartition(n, key)` would otherwise hash two keys to one partition and leave
another idle): found once per partition count by asking Spark to hash a range of
candidates with the same `hash` (Murmur3, seed 42) that hash partitioning uses. Training
still groups rows by model index, so results stay right even if the pinning did not hold.

A plain Parquet scan with few models is shuffled without Spark's shuffle (`in_place`):
each of the K training tasks (one per model) reads every row group itself, draws every
row's model from the seed as every other task does, and keeps its own model's rows. The
shuffle moved each row from Python to the JVM, through a shuffle file written twice, and
back (7.4 s of a 25.5 s fit at 1e6 rows x 50 on 2 cores); reading the whole file and
keeping half of it costs a task 0.5 CPU seconds. Every task reads all rows, so this pays
only while the tasks are few (`MAX_READERS_IN_PLACE`).

Without a shuffle (shuffle=False, `own_parts`) there is no spread stage: each training
task reads its own part and spreads it over its own models (see training).

The Spark side of both is here too, in pyspark's public API (imported on first use, so a
task importing this module pays nothing for it): a function of this module or of
`training` runs on every partition through `mapInArrow`, taking an iterator of Arrow
record batches and yielding record batches of the given schema (a Spark DDL string).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from sparkdist.ensemble.fit.parquet_source import ParquetSource, find_parquet_source, read_split
from sparkdist.ensemble.fit.validation import DataReport
from sparkdist.ensemble.model.features import FeatureSpec
from sparkdist.spark.task import partition_id

logger = logging.getLogger(__name__)

# Rows are cut into chunks this many bytes at a time: a chunk is one binary value, which
# no Arrow batch can split, so this bounds what a training task holds beside its matrix.
_MAX_CHUNK_BYTES = 4 * 2**20
# At most this many training tasks each read the whole data in place of a shuffle: K
# readers decode K times the data (0.5 CPU s per 1e6 x 50 rows each), the shuffle once
# but at 3-15 CPU s per 1e6 rows on 2 cores (Arrow to the JVM, a shuffle file written
# twice, back to Python).
MAX_READERS_IN_PLACE = 4
# Keys depend only on the partition count (Spark's hash is fixed), so one lookup per count.
_keys_by_count: dict[int, list[int]] = {}


@dataclass(frozen=True)
class SpreadPlan:
    """What a source task needs to cut its rows into chunks; shipped in the task closure."""

    keys: tuple[int, ...]  # keys[p] is hashed to training partition p
    n_models: int  # model j trains in partition j % len(keys)
    seed: int
    n_features: int  # 0: a vector column, the size is read from the data
    element: str  # "float" or "double": the features' type in the chunks
    is_classifier: bool
    label_is_numeric: bool


def chunk_schema(label_is_numeric: bool) -> str:
    """The spread's rows: a data chunk has features and labels, a report only `report`."""
    label = "double" if label_is_numeric else "string"
    return (
        "key int, model_index int, source int, piece int, features binary, "
        f"labels array<{label}>, report string"
    )


def spread(df: Any, spec: FeatureSpec, label_col: str, plan: SpreadPlan, slots: int | None) -> Any:
    """(key, model index, source, piece, features, labels, report) rows: training
    partition p holds the chunks of models p, p + P, p + 2P, ... (P partitions), sorted by
    model and then by where they were cut, after a report from every source task.

    A plain Parquet scan's files are read by pyarrow in the source tasks (see
    parquet_source), cut into splits for the cluster's `slots` task slots; any other
    DataFrame is read by Spark.
    """
    from pyspark.sql import functions as F

    schema = chunk_schema(plan.label_is_numeric)
    files = find_parquet_source(df, spec, label_col, plan.label_is_numeric, slots)
    if files is not None:
        cut = partial(cut_file_chunks, plan, files)
        chunks = indexes(df.sparkSession, len(files.splits)).mapInArrow(cut, schema)
    else:
        rows = _spark_rows(df, spec, label_col, plan)
        chunks = rows.mapInArrow(partial(cut_chunks, plan), schema)
    # A key from `partition_keys` reaches the partition it was found for. Sorted, a
    # training task receives one model's rows after another and fits each as soon as its
    # rows are in; the order is the same in every run of the same data.
    return chunks.repartition(len(plan.keys), F.col("key")).sortWithinPartitions(
        "model_index", "source", "piece"
    )


def own_parts(
    df: Any, spec: FeatureSpec, label_col: str, plan: SpreadPlan, n_parts: int
) -> tuple[Any, ParquetSource | None]:
    """For training without a shuffle: (a DataFrame of `n_parts` partitions, the Parquet
    files to read or None). Partition p holds split number p of a plain Parquet scan (equal
    row counts, read by the task), or else Spark's rows coalesced into `n_parts` partitions
    (fewer if `df` has fewer)."""
    files = find_parquet_source(
        df, spec, label_col, plan.label_is_numeric, slots=None, parts=n_parts
    )
    if files is not None:
        return indexes(df.sparkSession, n_parts), files
    return _spark_rows(df, spec, label_col, plan).coalesce(n_parts), None


def in_place(
    df: Any, spec: FeatureSpec, label_col: str, label_is_numeric: bool, n_models: int
) -> ParquetSource | None:
    """For a shuffle read in place: a plain Parquet scan's files as one split of every
    row, in file order, or None when Spark must read them or the models are more than
    `MAX_READERS_IN_PLACE` (each model's task reads every row)."""
    if n_models > MAX_READERS_IN_PLACE:
        return None
    return find_parquet_source(df, spec, label_col, label_is_numeric, slots=None, parts=1)


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


def indexes(session: Any, n: int) -> Any:
    """A DataFrame of `n` partitions, partition i holding one row, the int i (`id`): the
    task of partition i reads Parquet split i."""
    return session.range(0, n, 1, n)


def _spark_rows(df: Any, spec: FeatureSpec, label_col: str, plan: SpreadPlan) -> Any:
    """`df` as (features array, label) for Spark to read and hand to Python, the label a
    double when numeric.

    One array column, also for plain feature columns: Spark hands it to Python faster
    (4.1 s against 5.8 s for 1e6 rows x 50 floats), and it is one reshape.
    """
    from pyspark.sql import functions as F

    label = F.col(label_col).cast("double") if plan.label_is_numeric else F.col(label_col)
    return df.select(spec.spark_array(df.schema, plan.element), label)


def cut_chunks(plan: SpreadPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow function on a source partition read by Spark: each batch's rows as one
    chunk per model index drawn, then one report per target partition."""
    report = DataReport()
    yield from _cut(plan, report, spark_pieces(plan, report, batches))


def cut_file_chunks(
    plan: SpreadPlan, files: ParquetSource, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """mapInArrow function over split numbers: reads each split's Parquet row groups and
    cuts them as `cut_chunks` cuts Spark's batches."""
    report = DataReport()
    yield from _cut(plan, report, file_pieces(plan, files, report, batches))


def spark_pieces(
    plan: SpreadPlan, report: DataReport, batches: Iterator[pa.RecordBatch]
) -> Iterator[tuple[np.ndarray | None, pa.Array]]:
    """(features, labels) of Spark's batches of (feature array, label), at most a chunk's
    bytes at a time, each checked into `report`; no features once a check failed."""
    dtype = _dtype(plan)
    for batch in batches:
        if batch.num_rows == 0:
            continue
        width = plan.n_features or _vector_width(batch.column(0))
        step = _rows_per_chunk(width, dtype)
        for start in range(0, batch.num_rows, step):
            piece = batch.slice(start, step)
            yield _checked_rows(plan, piece.column(0), piece.column(1), dtype, report)


def file_pieces(
    plan: SpreadPlan,
    files: ParquetSource,
    report: DataReport,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[tuple[np.ndarray | None, pa.Array]]:
    """`spark_pieces` of the Parquet splits whose numbers the batches hold."""
    for batch in batches:
        for split in batch.column(0).to_pylist():
            yield from split_pieces(plan, files, split, report)


def split_pieces(
    plan: SpreadPlan,
    files: ParquetSource,
    split: int,
    report: DataReport,
    keep: np.ndarray | None = None,
) -> Iterator[tuple[np.ndarray | None, pa.Array]]:
    """`spark_pieces` of Parquet split number `split`, in file order. With `keep` (a mask
    over the split's rows) a plain columns' matrix holds only the kept rows of its piece,
    the labels and the checks all of them (see read_split)."""
    dtype = _dtype(plan)
    max_rows = _rows_per_chunk(plan.n_features or 1, dtype)
    for features, labels in read_split(files, files.splits[split], dtype, max_rows, keep):
        if isinstance(features, np.ndarray):
            report.add_labels(labels, plan.is_classifier, plan.label_is_numeric)
            report.add_vectors(0, np.array([features.shape[1]]))
            yield (features if report.clean else None), labels
        else:
            # A list column's width is known only now: cut to the same bound.
            step = _rows_per_chunk(_vector_width(features), dtype)
            for start in range(0, len(features), step):
                yield _checked_rows(
                    plan,
                    features.slice(start, step),
                    labels.slice(start, step),
                    dtype,
                    report,
                )


def _cut(
    plan: SpreadPlan,
    report: DataReport,
    pieces: Iterator[tuple[np.ndarray | None, pa.Array]],
) -> Iterator[pa.RecordBatch]:
    """Chunks of each checked piece's rows, by a random model index per row, then this
    source task's report to every target partition.

    Rows of a piece that fails a check (null label, null or odd-sized feature vector) are
    not sent: training will not run, and the report says why.
    """
    source = max(0, partition_id())  # source 0 outside a task: it seeds the draw
    rng = np.random.default_rng([plan.seed, 2, source])
    for piece, (X, labels) in enumerate(pieces):
        if X is not None and report.clean:
            index = rng.integers(0, plan.n_models, len(X))
            yield _chunks(plan, source, piece, index, X, labels)
    n_parts = len(plan.keys)
    yield pa.RecordBatch.from_pydict(
        {
            "key": pa.array(plan.keys, pa.int32()),
            "model_index": pa.array([-1] * n_parts, pa.int32()),  # sorts first
            "source": pa.array([source] * n_parts, pa.int32()),
            "piece": pa.array([-1] * n_parts, pa.int32()),
            "features": pa.nulls(n_parts, pa.binary()),
            "labels": pa.nulls(n_parts, _labels_type(plan.label_is_numeric)),
            "report": pa.array([report.to_json()] * n_parts, pa.string()),
        }
    )


def _rows_per_chunk(width: int, dtype: Any) -> int:
    """Rows of `width` features cut at once, so that a chunk stays within the bound."""
    return max(1, _MAX_CHUNK_BYTES // max(1, width * np.dtype(dtype).itemsize))


def _dtype(plan: SpreadPlan) -> Any:
    return np.float32 if plan.element == "float" else np.float64


def _checked_rows(
    plan: SpreadPlan, vectors: pa.Array, labels: pa.Array, dtype: Any, report: DataReport
) -> tuple[np.ndarray | None, pa.Array]:
    """The feature matrix of a list column and its labels, the checks added to `report`;
    no matrix if a feature vector is null or of another size."""
    report.add_labels(labels, plan.is_classifier, plan.label_is_numeric)
    valid = vectors.drop_null() if vectors.null_count else vectors
    report.add_vectors(vectors.null_count, valid.value_lengths().to_numpy())
    if not report.clean:
        return None, labels
    values = vectors.flatten().to_numpy(zero_copy_only=False)
    return values.astype(dtype, copy=False).reshape(len(vectors), -1), labels


def _chunks(
    plan: SpreadPlan, source: int, piece: int, index: np.ndarray, X: np.ndarray, labels: pa.Array
) -> pa.RecordBatch:
    """One row per model index drawn: its rows' features as bytes and their labels."""
    order = np.argsort(index, kind="stable")
    counts = np.bincount(index, minlength=plan.n_models)
    drawn = np.flatnonzero(counts)
    row_ends = np.cumsum(counts[drawn])
    row_offsets = np.concatenate([[0], row_ends]).astype(np.int32)
    byte_offsets = (row_offsets.astype(np.int64) * X.shape[1] * X.itemsize).astype(np.int32)
    features = pa.Array.from_buffers(
        pa.binary(),
        len(drawn),
        [None, pa.py_buffer(byte_offsets), pa.py_buffer(np.ascontiguousarray(X[order]))],
    )
    label_values = labels.take(pa.array(order))
    return pa.RecordBatch.from_pydict(
        {
            "key": pa.array(np.asarray(plan.keys, dtype=np.int32)[drawn % len(plan.keys)]),
            "model_index": pa.array(drawn.astype(np.int32)),
            "source": pa.array(np.full(len(drawn), source, dtype=np.int32)),
            "piece": pa.array(np.full(len(drawn), piece, dtype=np.int32)),
            "features": features,
            "labels": pa.ListArray.from_arrays(
                pa.array(row_offsets),
                label_values,
                type=_labels_type(plan.label_is_numeric),
            ),
            "report": pa.nulls(len(drawn), pa.string()),
        }
    )


def read_chunks(
    batch: pa.RecordBatch,
) -> tuple[list[tuple[int, np.ndarray, pa.Array]], dict[int, str]]:
    """A spread batch's data chunks in order, as (model index, feature bytes, labels) with
    the bytes a uint8 view into the batch, and its reports by source task (JSON)."""
    index = batch.column("model_index").to_numpy(zero_copy_only=False)
    sources = batch.column("source").to_numpy(zero_copy_only=False)
    features, labels = batch.column("features"), batch.column("labels")
    reports = batch.column("report")
    _, offsets, data = features.buffers()
    wide = pa.types.is_large_binary(features.type)  # spark.sql.execution.arrow.useLargeVarTypes
    offsets = np.frombuffer(offsets, dtype=np.int64 if wide else np.int32)[features.offset :]
    data = np.empty(0, np.uint8) if data is None else np.frombuffer(data, dtype=np.uint8)
    label_offsets = labels.offsets.to_numpy()
    chunks, by_source = [], {}
    for row in range(batch.num_rows):
        if reports[row].is_valid:
            by_source[int(sources[row])] = reports[row].as_py()
        else:
            start, stop = label_offsets[row], label_offsets[row + 1]
            chunks.append(
                (
                    int(index[row]),
                    data[offsets[row] : offsets[row + 1]],
                    labels.values.slice(start, stop - start),
                )
            )
    return chunks, by_source


def _labels_type(label_is_numeric: bool) -> pa.DataType:
    value = pa.float64() if label_is_numeric else pa.string()
    return pa.list_(pa.field("element", value))


def _vector_width(vectors: pa.Array) -> int:
    valid = vectors.drop_null() if vectors.null_count else vectors
    return len(valid[0]) if len(valid) else 1
