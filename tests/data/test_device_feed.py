"""`sparkdist.data.rank.device_feed` and `chunk_ring`: chunks gathered into a ring of host
slots, copied whole, cut into batches on the device; the automatic fallback to `.to()`.

On CPU (``device="cpu"``) the loader's batches, both ways ("ring" and "plain"), equal the
plain CPU path's, batch for batch, in two shapes (64 scalar columns with an id, a bool, a
uint16 and a string; one array column), shuffled with one and two decode threads, with
`features=` stacks, pads, a transform and a global batch through a 3 -> 2 -> 3 world. The
ring's safety runs against a stand-in device whose copies run only when the host waits
for them (`LateSide`): a slot filled again before its copy ran hands out the wrong rows.
The fallback's choice runs with a clock the stand-in's copies advance.
"""

from __future__ import annotations

import itertools
import logging

import numpy as np
import pyarrow as pa
import pytest
import torch
from helpers import write_row_groups

from sparkdist.data.converter import SparkDatasetConverter
from sparkdist.data.layout import describe
from sparkdist.data.rank import chunk_ring, reader
from sparkdist.data.rank.device_feed import TRIAL_CHUNKS, Choice, ChunkFeed, feed_mode
from sparkdist.data.rank.device_prefetch import HostSide
from sparkdist.data.rank.transform import TransformSpec

ROW_GROUPS = [[700, 300], [1000], [250, 5, 45]]  # rows per row group, per file
COLUMNS = [f"f{i}" for i in range(64)]
SHUFFLED = {"shuffle": True, "seed": 7, "shuffle_buffer_rows": 600}


def _write(directory, shape: str):
    first = 0
    for index, groups in enumerate(ROW_GROUPS):
        ids = np.arange(first, first + sum(groups), dtype=np.int64)
        matrix = np.random.default_rng(index).random((len(ids), len(COLUMNS)), dtype=np.float32)
        columns = {"id": pa.array(ids)}
        if shape == "wide":
            columns.update({name: matrix[:, i] for i, name in enumerate(COLUMNS)})
            columns["flag"] = pa.array(ids % 3 == 0)
            columns["small"] = pa.array((ids % 500).astype(np.uint16))
            columns["name"] = pa.array([f"row-{i}" for i in ids])
        else:
            flat = pa.array(matrix.reshape(-1))
            columns["x"] = pa.FixedSizeListArray.from_arrays(flat, len(COLUMNS)).cast(
                pa.list_(pa.float32())
            )
        write_row_groups(directory / f"part-{index}.parquet", pa.table(columns), groups)
        first += len(ids)
    return describe(directory.as_uri())


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    return {shape: _write(tmp_path_factory.mktemp(shape), shape) for shape in ("wide", "array")}


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(reader, "CHUNK_BYTES", 64 << 10)  # chunks of about 240 wide rows


def _loader(layout, tensor_types="petastorm", **options):
    converter = SparkDatasetConverter(None, layout, source="parquet", tensor_types=tensor_types)
    return converter.make_torch_dataloader(**options)


def _assert_same_batches(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want) > 5
    for out, expected in zip(got, want, strict=True):
        assert list(out) == list(expected)
        for name, values in expected.items():
            if isinstance(values, torch.Tensor):
                assert (out[name].dtype, out[name].shape) == (values.dtype, values.shape), name
                assert torch.equal(out[name], values), name
            else:
                assert out[name] == values, name


def _double(frame):
    frame["f9"] = frame["f0"] * 2
    return frame


READS = {
    "in-order": {},
    "shuffled": SHUFFLED,
    "two-workers": {**SHUFFLED, "workers_count": 2},
    "no-prefetch": {**SHUFFLED, "workers_count": 2, "prefetch": 0},
    "pads": {**SHUFFLED, "pad_column": "is_pad", "cur_shard": 1, "shard_count": 3},
    "in-order-features": {"features": {"x": COLUMNS}},
    "features": {**SHUFFLED, "workers_count": 2, "features": {"x": COLUMNS}},
    "transform": {
        **SHUFFLED,
        "transform_spec": TransformSpec(_double, edit_fields=[("f9", np.float32, (), False)]),
    },
}


@pytest.mark.parametrize("mode", ["ring", "plain"])
@pytest.mark.parametrize(
    ("shape", "read"),
    [("wide", read) for read in READS] + [("array", read) for read in list(READS)[:5]],
)
def test_batches_and_their_order_equal_the_cpu_path(layouts, shape, read, mode):
    """Batches of 37 rows (many across two chunks: joined on the device), two epochs."""
    options = {"batch_size": 37, "num_epochs": 2, **READS[read]}
    with _loader(layouts[shape], **options) as loader:
        want = list(loader)
    with _loader(layouts[shape], device="cpu", device_feed=mode, **options) as loader:
        got = list(loader)
    _assert_same_batches(got, want)
    if shape == "wide" and read == "shuffled" and mode == "ring":
        assert got[0]["small"].dtype == torch.int32 and got[0]["flag"].dtype == torch.uint8
        assert isinstance(got[0]["name"], list)


def test_batches_are_counted_when_handed_out_not_when_copied(layouts):
    """The chunks ahead are on their way (copied, cut), but the position moves with the
    batches the loop got, and a new loader resumes right after them."""
    options = {"batch_size": 37, "num_epochs": 1, **SHUFFLED, "workers_count": 2}
    with _loader(layouts["wide"], device="cpu", device_feed="ring", **options) as loader:
        batches = iter(loader)
        first = [next(batches) for _ in range(3)]
        state = loader.state_dict()
    assert state["rows_consumed"] == 3 * 37
    with _loader(layouts["wide"], device="cpu", device_feed="ring", **options) as loader:
        loader.load_state_dict(state)
        rest = list(loader)
    with _loader(layouts["wide"], **options) as loader:
        _assert_same_batches(first + rest, list(loader))


def _history(layout, device: str | None, worlds=(3, 2, 3), steps=(2, 3, None)) -> list:
    """Every rank's batches as the world changes size mid-epoch (global batch of 60):
    ``steps[i]`` lockstep steps in a world of ``worlds[i]`` ranks, then the next world
    resumes from rank 0's state."""
    options = {"global_batch_size": 60, "num_epochs": 1, **SHUFFLED, "workers_count": 2}
    if device is not None:
        options.update(device=device, device_feed="ring")
    state, out = None, []
    for world, count in zip(worlds, steps, strict=True):
        contexts = [
            _loader(layout, **options, cur_shard=r, shard_count=world) for r in range(world)
        ]
        loaders = [context.__enter__() for context in contexts]
        if state is not None:
            for loader in loaders:
                loader.load_state_dict(state)
        iterators = [iter(loader) for loader in loaders]
        for _ in itertools.count() if count is None else range(count):
            batches = [next(iterator, None) for iterator in iterators]
            if batches[0] is None:
                break
            out.append(batches)
        state = loaders[0].state_dict()
        for context in contexts:
            context.__exit__(None, None, None)
    return out


@pytest.mark.parametrize("shape", ["wide", "array"])
def test_a_global_batch_through_3_2_3_equals_the_cpu_path(layouts, shape):
    want, got = _history(layouts[shape], None), _history(layouts[shape], "cpu")
    assert len(got) == len(want) > 5
    for got_step, want_step in zip(got, want, strict=True):
        _assert_same_batches(got_step, want_step) if len(got_step) > 5 else None
        for out, expected in zip(got_step, want_step, strict=True):
            assert torch.equal(out["id"], expected["id"])
            assert torch.equal(out["row_weight"], expected["row_weight"])


@pytest.mark.parametrize("read", ["in-order", "two-workers", "in-order-features", "features"])
def test_a_batch_held_stays_as_it_was_handed_out(layouts, read):
    """Every 7th batch held to the end: the slots it came through were filled again many
    times since (a ring of a few slots, about 30 chunks)."""
    options = {"batch_size": 37, "num_epochs": 3, **READS[read]}
    with _loader(layouts["wide"], device="cpu", device_feed="ring", **options) as loader:
        held, copies = [], []
        for index, batch in enumerate(loader):
            if index % 7 == 0:
                held.append(batch)
                copies.append({k: v.clone() for k, v in batch.items() if torch.is_tensor(v)})
    assert len(held) > 20
    for batch, copy in zip(held, copies, strict=True):
        for name, values in copy.items():
            assert torch.equal(batch[name], values), name


class LateCopy:
    """A copy on a stand-in side stream: it runs only when the host waits for it, or when
    the device catches up with its queue (`LateSide.catch_up`), reading the host bytes
    as they are then."""

    def __init__(self, host: torch.Tensor) -> None:
        self.host, self.device, self.ran = host, torch.empty_like(host), False

    def run(self) -> None:
        if not self.ran:
            self.device.copy_(self.host)
            self.ran = True


class LateSide(HostSide):
    """A side whose copies run as late as a GPU running behind the host may run them,
    and whose costs advance a clock of its own (`clock`, in seconds): ``ring`` a copy,
    ``plain`` a column."""

    moves = True

    def __init__(self, ring: float = 0.0, plain: float = 0.0) -> None:
        super().__init__("cpu", 0)
        self.costs = {"ring": ring, "plain": plain}
        self.now, self.allocated = 0.0, 0
        self.queued: list[LateCopy] = []
        self.readied: set[int] = set()  # the device bytes held for the compute stream

    def clock(self) -> float:
        return self.now

    def host_bytes(self, nbytes: int) -> torch.Tensor:
        self.allocated += 1
        return torch.empty(nbytes, dtype=torch.uint8)

    def copy_out(self, host):
        self.now += self.costs["ring"]
        copy = LateCopy(host)
        self.queued.append(copy)
        return copy.device, copy

    def wait_for_copy(self, done: LateCopy) -> None:
        done.run()

    def copy_done(self, done: LateCopy) -> bool:
        return done.ran

    def plain(self, values):
        self.now += self.costs["plain"]
        return torch.from_numpy(values).clone()

    def catch_up(self) -> None:
        for copy in self.queued:
            copy.run()

    def ready(self, packed, done) -> None:
        self.readied.add(packed.untyped_storage().data_ptr())


def _chunks(feed: ChunkFeed, count: int, rows: int):
    """Chunks as a shuffled read makes them: ``x`` and ``y`` gathered into the feed's
    memory (a slot), a weight mark made after (packed into the slot's tail)."""
    for k in range(count):
        memory = feed.memory(2 * chunk_ring.ALIGN + rows * 12, rows)
        x = memory.carve((rows, 2), np.float32)
        x[:] = np.arange(2 * rows).reshape(rows, 2) + 1000 * k
        y = memory.carve((rows,), np.int32)
        y[:] = k
        yield {"x": x, "y": y, "w": np.full(rows, k / 2, np.float32)}


def test_a_slot_is_filled_again_only_after_its_copy_ran():
    """30 chunks through a ring of 3 slots on a stand-in device that runs behind the host:
    no copy runs until the host waits for it or the device catches up at the end. Every
    batch (all held to the end) equals its source rows, so no slot was filled again
    under a copy still to run; the slots were allocated once.

    (Without the host's wait in `SlotRing.take`, batches of later chunks come out in
    earlier ones' places and this fails.)"""
    side = LateSide()
    feed = ChunkFeed(side, slots=3, choice=Choice("ring"))
    batches = list(
        feed.hand_out(itertools.chain.from_iterable(feed.runs(_chunks(feed, 30, 40), 8)))
    )
    side.catch_up()
    assert len(batches) == 150 and side.allocated == 3 and len(side.queued) == 30
    for index, batch in enumerate(batches):
        k, part = divmod(index, 5)
        rows = np.arange(2 * 40).reshape(40, 2)[8 * part : 8 * part + 8] + 1000 * k
        np.testing.assert_array_equal(batch["x"].numpy(), rows)
        assert batch["y"].tolist() == [k] * 8 and batch["w"].tolist() == [k / 2] * 8


class InOrderSide(LateSide):
    """A `LateSide` whose copies run at once: the joins on the host then read them, as
    joins queued on the stream behind the copies do."""

    def copy_out(self, host):
        device, copy = super().copy_out(host)
        copy.run()
        return device, copy


@pytest.mark.parametrize("mode", ["ring", "plain"])
def test_every_batch_handed_out_is_held_for_the_compute_stream(mode):
    """Chunks of 12 rows in batches of 8: every other batch is joined from two chunks
    (bytes of its own), the others are views of a chunk's copy. Each batch's bytes are
    held for the compute stream (`record_stream`) by the time it is handed out."""
    side = InOrderSide()
    feed = ChunkFeed(side, slots=3, choice=Choice(mode))
    runs = feed.runs(_chunks(feed, 10, 12), 8)
    batches = []
    for batch in feed.hand_out(itertools.chain.from_iterable(runs)):
        for values in (batch["x"], batch["y"], batch["w"]):
            assert values.untyped_storage().data_ptr() in side.readied
        batches.append(batch)
    assert len(batches) == 15
    ids = np.concatenate([np.full(12, k) for k in range(10)])
    for index, batch in enumerate(batches):
        assert batch["y"].tolist() == ids[8 * index : 8 * index + 8].tolist()


@pytest.mark.parametrize(
    ("ring", "plain", "kept"), [(0.002, 0.003, "ring"), (0.003, 0.002, "plain")]
)
def test_the_feed_keeps_the_faster_way_after_timing_both(caplog, ring, plain, kept):
    """The first chunk warms up; the next `TRIAL_CHUNKS` run both ways (one copy the
    ring, a column at a time plain: 3 columns), then the faster is kept, logged."""
    side = LateSide(ring=ring, plain=plain / 3)
    feed = ChunkFeed(side, slots=4, choice=Choice("auto"), clock=side.clock)
    caplog.set_level(logging.INFO, "sparkdist.data.rank.device_feed")
    runs = feed.runs(_chunks(feed, 2 + TRIAL_CHUNKS, 16), 8)  # a run a chunk
    for _ in range(TRIAL_CHUNKS):
        next(runs)
        assert feed.choice.mode == "auto"
    next(runs)
    assert feed.choice.mode == kept and len(feed.choice.ring) == TRIAL_CHUNKS
    assert f"keeping {'the ring' if kept == 'ring' else 'plain .to()'}" in caplog.text
    memory = feed.memory(256, 1)
    assert isinstance(memory, chunk_ring.Slot) == (kept == "ring")


def test_the_way_is_forced_by_option_or_env(monkeypatch):
    assert feed_mode(None) == "auto" and feed_mode("plain") == "plain"
    monkeypatch.setenv("SPARKDIST_DEVICE_FEED", "ring")
    assert feed_mode(None) == "ring"
    with pytest.raises(ValueError, match="one of"):
        feed_mode("fast")


@pytest.mark.parametrize(
    ("read", "gathered"), [("shuffled", True), ("in-order-features", True), ("in-order", False)]
)
def test_rows_are_gathered_straight_into_the_slots(layouts, monkeypatch, read, gathered):
    """Shuffled, and stacked in order, the decode threads write each chunk into a slot
    (`ChunkFeed.memory`), and the copy goes out of that slot: no slot is taken to pack
    the chunk again. In order without a stack, Arrow's buffers are packed once into a
    slot (the only host copy)."""
    takes, memories = [], []
    take, memory = chunk_ring.SlotRing.take, ChunkFeed.memory
    monkeypatch.setattr(chunk_ring.SlotRing, "take", lambda *a: takes.append(1) or take(*a))
    monkeypatch.setattr(ChunkFeed, "memory", lambda *a: memories.append(1) or memory(*a))
    options = {"batch_size": 37, "num_epochs": 1, **READS[read]}
    with _loader(layouts["wide"], device="cpu", device_feed="ring", **options) as loader:
        assert len(list(loader)) == 63
    assert len(takes) > 5 and len(memories) == (len(takes) if gathered else 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
@pytest.mark.parametrize("mode", ["ring", "plain", "auto"])
@pytest.mark.parametrize("read", ["in-order", "two-workers", "features"])
def test_batches_arrive_on_the_gpu_equal_to_the_cpu_path(layouts, read, mode):
    options = {"batch_size": 37, "num_epochs": 2, **READS[read]}
    with _loader(layouts["wide"], **options) as loader:
        want = list(loader)
    with _loader(layouts["wide"], device="cuda", device_feed=mode, **options) as loader:
        got = list(loader)
    assert all(v.device.type == "cuda" for b in got for v in b.values() if torch.is_tensor(v))
    cpu = [{k: v.cpu() if torch.is_tensor(v) else v for k, v in b.items()} for b in got]
    _assert_same_batches(cpu, want)
