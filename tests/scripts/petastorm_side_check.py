"""Runs inside the petastorm side environment (.venv-petastorm: Spark 3.5, pyarrow 14,
numpy 1.x, petastorm 0.13.1), where sparkdist.data should pick petastorm.

Started by tests/data/test_petastorm_side.py as a subprocess. It converts a small DataFrame
with a local Spark 3.5, reads it back shard by shard through make_torch_dataloader, and
prints what it saw as one JSON object on the last line of stdout; the test makes the
assertions, so a failure there shows the observed values.

    .venv-petastorm/bin/python tests/scripts/petastorm_side_check.py CACHE_DIR
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

N_ROWS = 1000
N_FEATURES = 3
SHARD_COUNT = 2


class Recorder(logging.Handler):
    """Keeps the messages sparkdist.data logs, for the test to check the backend choice."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def features_of(i: int) -> list[float]:
    """Row i's feature vector; every third row is stored as a sparse vector."""
    return [float(i), i / 4, 0.0 if i % 3 == 0 else -float(i)]


def build_dataframe(spark):
    from pyspark.ml.linalg import Vectors

    rows = []
    for i in range(N_ROWS):
        values = features_of(i)
        if i % 3 == 0:
            vector = Vectors.sparse(N_FEATURES, {k: v for k, v in enumerate(values) if v})
        else:
            vector = Vectors.dense(values)
        rows.append((i, vector, float(i % 3)))
    return spark.createDataFrame(rows, ["id", "features", "label"]).repartition(4)


def read_shards(converter, backend: str) -> list[dict]:
    """Every shard once (one epoch each): ids, features and what the loader handed out."""
    shards = []
    for shard in range(SHARD_COUNT):
        ids, features, labels, dtypes, loader_type = [], [], [], set(), ""
        with converter.make_torch_dataloader(
            batch_size=64, num_epochs=1, cur_shard=shard, shard_count=SHARD_COUNT
        ) as loader:
            loader_type = f"{type(loader).__module__}.{type(loader).__qualname__}"
            for batch in loader:
                ids += [int(i) for i in batch["id"]]
                features += batch["features"].tolist()
                labels += [float(v) for v in batch["label"]]
                dtypes.add(f"{type(batch['features']).__name__}:{batch['features'].dtype}")
        shards.append(
            {
                "backend": backend,
                "loader": loader_type,
                "ids": ids,
                "features": features,
                "labels": labels,
                "feature_types": sorted(dtypes),
            }
        )
    return shards


def main() -> None:
    started = time.perf_counter()
    cache_parent = Path(sys.argv[1])
    recorder = Recorder()
    data_logger = logging.getLogger("sparkdist.data")
    data_logger.setLevel(logging.INFO)
    data_logger.addHandler(recorder)
    logging.basicConfig(level=logging.WARNING)

    import numpy
    import petastorm
    import pyarrow
    import pyspark
    import torch
    from pyspark.sql import SparkSession

    import sparkdist
    from sparkdist.data import make_spark_converter

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("sparkdist-petastorm-side")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        df = build_dataframe(spark)
        # Small row groups: petastorm shards by whole row groups and needs several.
        converter = make_spark_converter(
            df,
            parquet_row_group_size_bytes=1024,
            cache_dir_url=cache_parent.as_uri(),
            backend="petastorm",  # asked for: "auto" is the pyarrow reader
        )
        cache_dir = converter.cache_dir_url.removeprefix("file://")
        result = {
            "versions": {
                "pyspark": pyspark.__version__,
                "pyarrow": pyarrow.__version__,
                "numpy": numpy.__version__,
                "torch": torch.__version__,
                "petastorm": petastorm.__version__,
            },
            "sparkdist_file": sparkdist.__file__,
            "backend": converter.backend,
            "len": len(converter),
            "row_groups": converter.layout.num_row_groups,
            "shards": read_shards(converter, converter.backend),
            "cache_dir": cache_dir,
            "cache_dir_existed": os.path.isdir(cache_dir),
        }
        # The pyarrow reader on the same stack, from the same cache.
        forced = make_spark_converter(
            df,
            parquet_row_group_size_bytes=1024,
            cache_dir_url=cache_parent.as_uri(),
            backend="pyarrow",
        )
        result["pyarrow_shards"] = read_shards(forced, forced.backend)
        result["same_cache_for_pyarrow"] = forced.cache_dir_url == converter.cache_dir_url
        converter.delete()
        result["cache_dir_after_delete"] = os.path.exists(cache_dir)
        result["expected_features"] = [features_of(i) for i in range(N_ROWS)]
        result["log"] = recorder.messages
        result["seconds"] = time.perf_counter() - started
    finally:
        spark.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
