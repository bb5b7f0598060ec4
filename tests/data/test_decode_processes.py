"""Decode processes (``reader_pool_type="process"``): a window decoded in forked processes
that write its rows into shared memory reads exactly what the decode threads read.

The data is written with pyarrow (no Spark): an id, an int32 label, a float64 weight, a
boolean, eight float32 features and a fixed-length array, in row groups larger than a
read chunk, with shuffle windows that span several (Spark's files, read in place). The
processes are the real ones; one is killed by its pid to test a death.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from helpers import pid_running, shard_history, wait_for, write_row_groups

from sparkdist.data.converter import SparkDatasetConverter
from sparkdist.data.layout import describe
from sparkdist.data.rank import decode_processes, reader

ROW_GROUPS = [[700, 300], [1000], [250, 5, 45]]
SHUFFLED = {"shuffle": True, "seed": 7, "shuffle_buffer_rows": 600}
NUMBERS = ["id", "label", "weight", "flag", "vec", *[f"f{i}" for i in range(8)]]


def _table(ids: np.ndarray, nulls: bool = False) -> pa.Table:
    rng = np.random.default_rng(ids[0])
    matrix = rng.random((len(ids), 8), dtype=np.float32)
    vec = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(len(ids) * 3)), 3)
    columns = {
        "id": ids,
        "label": (ids % 10).astype(np.int32),
        "weight": pa.array(ids * 0.5, mask=(ids == ids[-1]) if nulls else None),
        "flag": ids % 3 == 0,
        "name": [f"row-{i}" for i in ids],
        "vec": vec.cast(pa.list_(pa.float64())),
    }
    columns |= {f"f{i}": matrix[:, i] for i in range(8)}
    return pa.table(columns)


def _write(directory, nulls: bool = False):
    first = 0
    for index, groups in enumerate(ROW_GROUPS):
        ids = np.arange(first, first + sum(groups), dtype=np.int64)
        last = nulls and index == len(ROW_GROUPS) - 1
        write_row_groups(directory / f"part-{index}.parquet", _table(ids, last), groups)
        first += len(ids)
    return describe(directory.as_uri())


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("processes"))


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(reader, "CHUNK_BYTES", 4096)  # chunks of about 40 rows


def _decoders() -> list[multiprocessing.Process]:
    return [p for p in multiprocessing.active_children() if p.name == "sparkdist-decode"]


@pytest.mark.parametrize(
    "read",
    [
        {},
        SHUFFLED,
        {**SHUFFLED, "pad_column": "is_pad"},
        {**SHUFFLED, "global_batch_size": 60},
        {**SHUFFLED, "features": {"x": r"f\d+"}},
        {"features": {"x": r"f\d+"}, "drop_last": True},
    ],
    ids=["in-order", "shuffled", "pads", "global-batch", "features", "in-order-features"],
)
@pytest.mark.parametrize("workers", [1, 2])
def test_processes_read_what_threads_read_through_3_2_3(layout, read, workers):
    """Rows, order, values, pads and weights are those of the decode threads, batch for
    batch, through a world resized 3 -> 2 -> 3 mid-epoch."""
    options = {"batch_size": 40, "num_epochs": 1, "columns": NUMBERS, "writable": True, **read}
    options["workers_count"] = workers
    threads = shard_history(layout, reader.ReadOptions(**options))
    processes = shard_history(layout, reader.ReadOptions(**options, decode_processes=True))
    assert len(processes) == len(threads) > 5
    for process_step, thread_step in zip(processes, threads, strict=True):
        for process_batch, thread_batch in zip(process_step, thread_step, strict=True):
            assert process_batch.keys() == thread_batch.keys()
            for name, values in thread_batch.items():
                np.testing.assert_array_equal(process_batch[name], values)
    assert not _decoders()


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_a_batch_held_stays_as_it_was_handed_out(layout, shuffle, kind):
    """Later windows, decoded by the processes into reused shared slabs, never write
    into a batch the loop still holds (two epochs, every 37th batch held)."""
    converter = SparkDatasetConverter(None, layout, source="parquet", tensor_types="torch")
    options = {"batch_size": 5, "num_epochs": 2, "shuffle": shuffle, "seed": 3}
    options |= {"columns": NUMBERS, "reader_pool_type": "process", "workers_count": 2}
    make = converter.make_numpy_batches if kind == "numpy" else converter.make_torch_dataloader
    with make(**options) as loader:
        held, copies, ids = [], [], []
        for index, batch in enumerate(loader):
            ids.extend(np.asarray(batch["id"]).tolist())
            if index % 37 == 0:
                held.append(batch)
                copies.append({name: np.array(values, copy=True) for name, values in batch.items()})
    assert sorted(ids) == sorted(list(range(2300)) * 2)
    assert len(held) > 10
    for batch, copy in zip(held, copies, strict=True):
        for name, values in batch.items():
            np.testing.assert_array_equal(np.asarray(values), copy[name])
    assert not _decoders()


@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "in-order"])
def test_a_decoding_error_in_a_process_reaches_the_loop_with_its_traceback(tmp_path, shuffle):
    """A null in the last row group: the loop gets the reader's own error, its cause the
    decode process's traceback, after every row before it; no process is left."""
    layout = _write(tmp_path, nulls=True)
    options = {"shuffle": shuffle, "seed": 0, "shuffle_buffer_rows": 100, "columns": NUMBERS}
    shard = reader.ShardReader(
        layout, batch_size=10, num_epochs=1, workers_count=2, decode_processes=True, **options
    )
    read = []
    with pytest.raises(ValueError, match="column 'weight' has null values") as raised:
        for batch in shard:
            read.extend(batch["id"].tolist())
    cause = raised.value.__cause__
    assert isinstance(cause, decode_processes.RemoteError)
    assert "_decode_remote" in str(cause) and "Traceback" in str(cause)
    if not shuffle:
        assert read == list(range(2250))  # every whole batch before the last row group
    assert not _decoders()


def test_a_decode_process_that_dies_is_an_error_not_a_hang(layout):
    """A decode process killed mid-read (SIGKILL, as the kernel's OOM killer does): the
    loop gets an error that says so, and the other process is stopped."""
    options = {"shuffle": True, "seed": 1, "shuffle_buffer_rows": 100, "columns": NUMBERS}
    shard = reader.ShardReader(
        layout,
        batch_size=10,
        num_epochs=None,
        workers_count=2,
        decode_processes=True,
        prefetch=0,
        **options,
    )
    batches = iter(shard)
    next(batches)
    victim = _decoders()[0]
    os.kill(victim.pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match="decode process died"):
        for _ in range(100_000):  # num_epochs=None: only the error ends it
            next(batches)
    shard.close()
    assert not _decoders()


def test_an_iteration_left_early_stops_its_processes(layout):
    """A loop that breaks after one batch stops the processes; the next iteration starts
    new ones and reads the rest of the epoch from the loader's position."""
    converter = SparkDatasetConverter(None, layout, source="parquet", tensor_types="torch")
    options = {"batch_size": 50, "num_epochs": 1, "shuffle": True, "seed": 2}
    with converter.make_numpy_batches(
        **options, columns=NUMBERS, reader_pool_type="process", workers_count=2
    ) as loader:
        for batch in loader:
            assert len(_decoders()) == 2
            first = batch["id"].tolist()
            break
        wait_for(lambda: not _decoders(), "the decode processes to stop", 30)
        rest = [i for batch in loader for i in batch["id"].tolist()]
    assert len(first) == 50 and sorted(first + rest) == list(range(2300))
    assert not _decoders()


def test_string_columns_and_dataloader_workers_decode_in_threads(layout, caplog):
    """Strings are Python objects, which shared memory cannot hold; a DataLoader worker
    is a process that may not start its own. Both read in threads, and say so once."""
    converter = SparkDatasetConverter(None, layout, source="parquet", tensor_types="torch")
    with caplog.at_level(logging.INFO, logger="sparkdist.data.rank.reader"):
        with converter.make_numpy_batches(
            batch_size=100, num_epochs=1, shuffle=True, reader_pool_type="process"
        ) as loader:
            names = [name for batch in loader for name in batch["name"]]
    assert sorted(names) == sorted(f"row-{i}" for i in range(2300))
    said = [
        r.getMessage() for r in caplog.records if "reader_pool_type='process'" in r.getMessage()
    ]
    assert len(said) == 1 and "string and binary columns (['name'])" in said[0]
    with converter.make_torch_dataloader(
        batch_size=100,
        num_epochs=1,
        columns=NUMBERS,
        reader_pool_type="process",
        num_workers=2,
    ) as loader:
        ids = [i for batch in loader for i in batch["id"].tolist()]
    assert sorted(ids) == list(range(2300))
    assert not _decoders()


def test_the_processes_leave_when_the_rank_is_killed(tmp_path):
    """A rank killed with SIGKILL cannot stop its decode processes: they see it gone and
    leave by themselves."""
    (tmp_path / "data").mkdir()
    _write(tmp_path / "data")
    script = tmp_path / "rank.py"
    script.write_text(
        "import sys, multiprocessing, time\n"
        "from sparkdist.data.layout import describe\n"
        "from sparkdist.data.rank import reader\n"
        f"shard = reader.ShardReader(describe({(tmp_path / 'data').as_uri()!r}), batch_size=10,\n"
        "    num_epochs=None,\n"
        f"    workers_count=2, decode_processes=True, prefetch=0, columns={NUMBERS!r})\n"
        "batches = iter(shard); next(batches)\n"
        "print(*[p.pid for p in multiprocessing.active_children()\n"
        "        if p.name == 'sparkdist-decode'], flush=True)\n"
        "time.sleep(600)\n"
    )
    rank = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(pid) for pid in rank.stdout.readline().split()]
        assert len(pids) == 2
    finally:
        rank.kill()
        rank.wait()
    wait_for(lambda: not any(map(pid_running, pids)), "the decode processes to leave", 30)
