"""The data path on a runtime's stack: a Spark DataFrame converted (its Parquet written by
that Spark, its vectors by that pyarrow and pandas) and read back by the ranks of a job."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sparkdist import HorovodRunner

N_ROWS = 200


def converter_frame(spark):
    """The rows of this module's `converter` (tests/helpers.py): written by the runtime's
    Spark, in small row groups."""
    from pyspark.ml.feature import VectorAssembler

    frame = pd.DataFrame(
        {
            "id": np.arange(N_ROWS, dtype="int64"),
            "x": np.arange(N_ROWS, dtype="float64") / 2,
            "flag": np.arange(N_ROWS) % 2 == 0,
        }
    )
    df = spark.createDataFrame(frame).repartition(3)
    df = VectorAssembler(inputCols=["x", "id"], outputCol="features").transform(df)
    return df.select("id", "x", "flag", "features")


def test_each_rank_reads_its_equal_shard_once(sc, converter):
    """`make_numpy_batches` (torch and TensorFlow need not be on the stack): rank r of 2
    reads its half."""

    def main(converter):
        import numpy as np

        with converter.make_numpy_batches(batch_size=16, num_epochs=1) as reader:
            batches = list(reader)
        return {
            "ids": np.concatenate([b["id"] for b in batches]).tolist(),
            "x": np.concatenate([b["x"] for b in batches]).tolist(),
            "features": np.concatenate([b["features"] for b in batches]),
            "dtypes": {name: str(array.dtype) for name, array in batches[0].items()},
        }

    shards = HorovodRunner(np=2, launcher="direct", timeout=300).run_all(main, converter=converter)
    assert len(converter) == N_ROWS
    ids = [shard["ids"] for shard in shards]
    assert len(ids[0]) == len(ids[1]) == N_ROWS // 2
    assert sorted(ids[0] + ids[1]) == list(range(N_ROWS))
    for shard in shards:
        rows = np.asarray(shard["ids"])
        np.testing.assert_allclose(shard["x"], rows / 2)
        expected = np.stack([rows / 2, rows], axis=1).astype("float32")
        np.testing.assert_array_equal(shard["features"], expected)
        assert shard["dtypes"] == {
            "id": "int64",
            "x": "float32",
            "flag": "bool",
            "features": "float32",
        }
