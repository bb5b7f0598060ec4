"""An in-order read's row groups streamed a group of columns a thread (`column_streams`).

One Parquet file of 4 row groups, written with pyarrow: an int64 id, two float32 and a
string column, so the groups hold columns of different widths and kinds.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pytest
from helpers import write_row_groups

from sparkdist.data.rank import column_streams

GROUPS = [300, 200, 250, 250]


@pytest.fixture(scope="module")
def table_file(tmp_path_factory):
    ids = np.arange(sum(GROUPS))
    table = pa.table(
        {
            "id": ids,
            "a": (ids * 0.5).astype(np.float32),
            "b": (ids * 2.0).astype(np.float32),
            "name": [f"row-{i}" for i in ids],
        }
    )
    path = tmp_path_factory.mktemp("streams") / "part-0.parquet"
    write_row_groups(path, table, GROUPS)
    return path.as_uri(), table


@pytest.fixture
def pool():
    with ThreadPoolExecutor(2, "test-streams") as executor:
        yield executor


def test_column_groups_are_consecutive_and_of_about_equal_bytes():
    widths = {"id": 8, "a": 4, "b": 4, "c": 4, "d": 4, "name": 32}
    assert column_streams.column_groups(widths, 2) == [["id", "a", "b", "c", "d"], ["name"]]
    even = {f"f{i}": 4 for i in range(8)}
    assert column_streams.column_groups(even, 2) == [
        [f"f{i}" for i in range(4)],
        [f"f{i}" for i in range(4, 8)],
    ]
    assert column_streams.column_groups(even, 1) == [list(even)]
    assert len(column_streams.column_groups({"x": 4}, 4)) == 1  # no more groups than columns


def test_each_row_groups_batches_come_joined_in_order(table_file, pool):
    url, table = table_file
    wanted = [(url, 2, 250), (url, 0, 300), (url, 3, 250)]  # any order, each whole
    groups = [["id", "a"], ["b", "name"]]
    seen = []
    with column_streams.ColumnStreams(wanted, 64, groups, pool) as streams:
        for (_, group, _), batches in zip(wanted, streams.row_groups(), strict=True):
            parts = list(batches)
            assert all(part.schema.names == ["id", "a", "b", "name"] for part in parts)
            assert [part.num_rows for part in parts][:-1] == [64] * (len(parts) - 1)
            first = sum(GROUPS[:group])
            expected = table.slice(first, GROUPS[group])
            assert pa.Table.from_batches(parts).equals(expected)
            seen.append(group)
    assert seen == [2, 0, 3]


def test_a_row_group_is_read_only_up_to_the_rows_wanted(table_file, pool):
    """The threads stop a row group at the chunk that holds its last wanted row, so the
    reading thread never waits on rows it does not want."""
    url, _ = table_file
    wanted = [(url, 0, 70), (url, 1, 200)]
    with column_streams.ColumnStreams(wanted, 64, [["id"], ["a"]], pool) as streams:
        first, second = (list(batches) for batches in streams.row_groups())
    assert [part.num_rows for part in first] == [64, 64]  # rows 0-127: 70 is in the second
    assert [part.num_rows for part in second] == [64, 64, 64, 8]
    assert second[0]["id"][0].as_py() == GROUPS[0]


def test_an_error_in_a_thread_is_raised_in_the_reading_thread(table_file, pool):
    url, _ = table_file
    wanted = [(url, 0, 300), (url, 9, 10)]  # the file has no row group 9
    with column_streams.ColumnStreams(wanted, 64, [["id"], ["a"]], pool) as streams:
        groups = streams.row_groups()
        assert sum(part.num_rows for part in next(groups)) == 300
        with pytest.raises(pa.ArrowInvalid, match="row_group_indices is 9"):
            list(next(groups))


def test_closing_early_stops_the_threads_that_read_ahead(table_file, pool):
    """Closed after one batch, with the threads blocked ahead on full queues: `close`
    returns once they stopped, and both of the pool's threads are free again."""
    url, _ = table_file
    wanted = [(url, group, rows) for group, rows in enumerate(GROUPS)] * 5
    streams = column_streams.ColumnStreams(wanted, 16, [["id", "a"], ["b"]], pool)
    assert next(next(streams.row_groups())).num_rows == 16
    streams.close()
    both = threading.Barrier(2)
    tasks = [pool.submit(both.wait, 10) for _ in range(2)]  # needs both threads at once
    assert sorted(task.result(timeout=20) for task in tasks) == [0, 1]
