"""ShardReader on files written with pyarrow (no Spark): rows come out in the global order.

Row groups here are larger than a read chunk, as Spark's are, so rows in the files' order
are streamed in pieces and a rank's slice starts and ends inside row groups.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from helpers import write_row_groups

from sparkdist.data.layout import Layout, describe
from sparkdist.data.rank import order, reader

ROW_GROUPS = [[700, 300], [1000], [250, 5, 45]]  # rows per row group, per file


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> Layout:
    directory = tmp_path_factory.mktemp("reader-source")
    first = 0
    for index, groups in enumerate(ROW_GROUPS):
        rows = sum(groups)
        ids = np.arange(first, first + rows, dtype=np.int64)
        features = pa.FixedSizeListArray.from_arrays(
            pa.array(np.repeat(ids, 4).astype(np.float32)), 4
        ).cast(pa.list_(pa.float32()))
        table = pa.table({"id": ids, "features": features})
        write_row_groups(directory / f"part-{index}.parquet", table, groups)
        first += rows
    return describe(directory.as_uri())


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("world", [2, 3])
def test_ranks_read_their_slice_of_the_global_order(layout, monkeypatch, shuffle, world):
    monkeypatch.setattr(reader, "CHUNK_BYTES", 64 * layout.row_bytes)  # 64-row chunks
    for rank in range(world):
        shard = reader.ShardReader(
            layout,
            batch_size=50,
            num_epochs=1,
            cur_shard=rank,
            shard_count=world,
            shuffle=shuffle,
            seed=5,
            shuffle_buffer_rows=600,
            writable=True,
            prefetch=0,
        )
        epoch_order = order.EpochOrder(layout.row_group_rows, 5, 0, shuffle, 600)
        expected = epoch_order.row_ids(shard.position.slice())
        batches = list(shard)
        ids = np.concatenate([batch["id"] for batch in batches])
        np.testing.assert_array_equal(ids, expected)
        features = np.concatenate([batch["features"] for batch in batches])
        np.testing.assert_array_equal(features, np.repeat(ids, 4).reshape(-1, 4))
        assert all(batch["features"].flags.writeable for batch in batches)
        assert [len(b["id"]) for b in batches[:-1]] == [50] * (len(batches) - 1)


def test_one_read_options_value_reaches_the_reader(layout):
    """A loader's arguments become one ReadOptions; keywords and the value read alike."""

    def loader(batch_size=32, shuffle=False, *, seed=None, shuffling_queue_capacity=0, **rest):
        return reader.ReadOptions.of(locals(), cur_shard=1, shard_count=2, prefetch=0)

    options = loader(40, seed=3, shuffling_queue_capacity=500, collate_fn=None)
    assert (options.batch_size, options.seed, options.cur_shard) == (40, 3, 1)
    assert options.shuffled and options.window_rows == 500  # petastorm's knob shuffles
    by_value = reader.ShardReader(layout, options, num_epochs=1)
    by_keywords = reader.ShardReader(
        layout,
        batch_size=40,
        num_epochs=1,
        cur_shard=1,
        shard_count=2,
        seed=3,
        shuffling_queue_capacity=500,
        prefetch=0,
    )
    ids = [np.concatenate([b["id"] for b in shard]) for shard in (by_value, by_keywords)]
    np.testing.assert_array_equal(ids[0], ids[1])
    assert len(ids[0]) == by_value.rows_in_shard
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        reader.ReadOptions(batch_size=0)
