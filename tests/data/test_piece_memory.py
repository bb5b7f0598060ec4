"""A shuffled read's piece memory: a slab is reused only once nothing refers to it.

The pieces of a shuffled window are handed out as they are (`sparkdist.data.rank.shuffled`),
in slabs that `PieceMemory` takes back when the last numpy view or torch tensor of them
is dropped: what a training loop still holds must never be written again.
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pyarrow as pa
import pytest
from helpers import write_row_groups

from sparkdist.data.layout import describe
from sparkdist.data.rank import reader, shared_slabs
from sparkdist.data.rank.piece_memory import PieceMemory


@pytest.mark.parametrize("shared", [False, True], ids=["private", "shared"])
def test_a_slab_comes_back_once_its_last_view_and_tensor_are_dropped(shared):
    torch = pytest.importorskip("torch")
    memory = PieceMemory(shared=shared)
    carver = memory.carver(4096)
    block = carver.carve((4, 100), np.float32)
    column = block[2]
    batch = column[10:20]
    tensor = torch.from_numpy(column[30:40])
    del carver, block, column
    gc.collect()
    assert not memory.free  # a batch and a tensor still refer to it
    del batch
    assert not memory.free
    del tensor
    assert len(memory.free) == 1 and len(memory.free[0][0]) >= 4096
    again = memory.carver(1024)
    assert not memory.free  # taken again, not a new one
    del again
    assert len(memory.free) == 1


def test_a_slab_too_small_for_a_piece_is_let_go_and_the_free_list_is_bounded():
    memory = PieceMemory(keep=2)
    small = [memory.carver(1000) for _ in range(4)]
    del small
    assert len(memory.free) == 4  # given back; trimmed at the next take
    big = memory.carver(5000)  # larger than any free slab: a new one, the small ones dropped
    assert len(big.host) == 5000 and not memory.free
    del big
    assert len(memory.free) == 1 and len(memory.free[0][0]) == 5000
    held = [memory.carver(100) for _ in range(5)]  # every new slab is of the largest size
    assert all(len(carver.host.base.base.slab[0]) == 5000 for carver in held[1:])
    del held
    memory.carver(100)
    assert len(memory.free) <= 2


def test_a_shared_slab_is_the_memory_a_decode_process_maps_and_is_closed_once_dropped():
    """A shared slab is found again through its handle (as a decode process finds it, by
    /proc/<pid>/fd), writes through either mapping are seen by the other, and its
    descriptor is closed once the slab is let go; every shared slab is kept."""
    memory = PieceMemory(keep=1, shared=True)
    carvers = [memory.carver(8192) for _ in range(3)]
    handles = [carver.handle for carver in carvers]
    assert len({handle.serial for handle in handles}) == 3
    block = carvers[0].carve((2, 1024), np.float32)
    block[1] = np.arange(1024)
    found = shared_slabs.view(
        handles[0], block.ctypes.data - carvers[0].host.ctypes.data, (2, 1024), "<f4"
    )
    np.testing.assert_array_equal(found[1], np.arange(1024))
    found[0] = 7
    assert (block[0] == 7).all()
    del block, found, carvers
    gc.collect()
    assert len(memory.free) == 3  # all kept: a decode process keeps its mappings
    fd = handles[0].fd
    assert os.path.exists(f"/proc/self/fd/{fd}")
    memory.free.clear()
    gc.collect()
    assert not any(
        os.path.exists(f"/proc/self/fd/{h.fd}")
        and os.readlink(f"/proc/self/fd/{h.fd}").startswith("/memfd:sparkdist")
        for h in handles
    )


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    rng = np.random.default_rng(5)
    directory = tmp_path_factory.mktemp("piece-memory")
    first = 0
    for index, groups in enumerate([[300, 300], [600]]):
        rows = sum(groups)
        columns = {"id": np.arange(first, first + rows), "name": [str(i) for i in range(rows)]}
        columns |= {f"f{i}": rng.random(rows, dtype=np.float32) for i in range(8)}
        write_row_groups(directory / f"part-{index}.parquet", pa.table(columns), groups)
        first += rows
    return describe(directory.as_uri())


def test_held_batches_stay_as_handed_out_while_the_dropped_ones_memory_is_reused(wide, monkeypatch):
    """Every 12th batch of eight shuffled epochs is held, the others dropped as read: the
    slabs of the dropped ones are reused (fewer slabs made than pieces), and no held batch
    changes."""
    monkeypatch.setattr(reader, "CHUNK_BYTES", 4096)  # pieces of about 28 rows
    options = {"shuffle": True, "seed": 11, "shuffle_buffer_rows": 400, "num_epochs": 8}
    shard = reader.ShardReader(wide, batch_size=8, workers_count=2, prefetch=2, **options)
    taken, made = [0], [0]
    original = shard._pieces.carver

    def carver(nbytes: int):
        free = len(shard._pieces.free)
        out = original(nbytes)
        taken[0] += 1
        made[0] += len(shard._pieces.free) >= free  # none came off the free list
        return out

    shard._pieces.carver = carver
    held, copies = [], []
    for index, batch in enumerate(shard):
        if index % 12 == 0:
            held.append(batch)
            copies.append({name: np.array(values, copy=True) for name, values in batch.items()})
    assert made[0] < taken[0] // 2  # most pieces were put in memory given back
    for batch, copy in zip(held, copies, strict=True):
        for name, values in batch.items():
            np.testing.assert_array_equal(values, copy[name])
        assert [str(i % 600 if i >= 600 else i) for i in batch["id"]] == list(batch["name"])
    ids = np.concatenate([batch["id"] for batch in held])
    assert len(set(ids.tolist())) > len(ids) // 4  # rows of all epochs, each its own
