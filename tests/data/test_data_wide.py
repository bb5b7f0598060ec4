"""Wide tables: features as scalar columns read as their array-column twin is, and stacked.

Two copies of the same values are written with pyarrow (no Spark): the "wide" one holds
the features as scalar columns f0..f7 (with an id, an int32 label, a float64 weight, a
boolean and a string among them, so that a window's byte matrix holds values of every
width), the "array" one as one fixed-length array column. Row groups are larger than a
read chunk and the shuffle windows span several, as Spark's files are read.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import os
import threading

import numpy as np
import pyarrow as pa
import pytest
from helpers import shard_history, write_row_groups
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkdist.data.converter import SparkDatasetConverter
from sparkdist.data.layout import ColumnInfo, describe
from sparkdist.data.rank import decode, order, reader, row_block, shuffled
from sparkdist.data.rank.transform import TransformSpec

ROW_GROUPS = [[700, 300], [1000], [250, 5, 45]]  # rows per row group, per file
FEATURES = [f"f{i}" for i in range(8)]
SHUFFLED = {"shuffle": True, "seed": 7, "shuffle_buffer_rows": 600}


def _values(ids: np.ndarray) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(ids[0])
    return {
        "id": ids,
        "label": (ids % 10).astype(np.int32),
        "weight": ids * 0.5,
        "flag": ids % 3 == 0,
        "name": np.array([f"row-{i}" for i in ids], dtype=object),
        "matrix": rng.random((len(ids), len(FEATURES)), dtype=np.float32),
    }


def _write(directory, shape: str):
    first = 0
    for index, groups in enumerate(ROW_GROUPS):
        rows = sum(groups)
        values = _values(np.arange(first, first + rows, dtype=np.int64))
        matrix = values.pop("matrix")
        columns = {
            name: pa.array(list(v) if v.dtype == object else v) for name, v in values.items()
        }
        if shape == "wide":
            columns.update({name: matrix[:, i] for i, name in enumerate(FEATURES)})
        else:
            flat = pa.array(matrix.reshape(-1))
            columns["features"] = pa.FixedSizeListArray.from_arrays(flat, len(FEATURES)).cast(
                pa.list_(pa.float32())
            )
        table = pa.table(columns)
        write_row_groups(directory / f"part-{index}.parquet", table, groups)
        first += rows
    return describe(directory.as_uri())


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    return {shape: _write(tmp_path_factory.mktemp(shape), shape) for shape in ("wide", "array")}


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(reader, "CHUNK_BYTES", 4096)  # chunks of about 64 rows


def _features(batch: dict, stacked: bool) -> np.ndarray:
    return batch["features"] if stacked else np.stack([batch[f] for f in FEATURES], axis=1)


@pytest.mark.parametrize("stacked", [False, True], ids=["columns", "features="])
@pytest.mark.parametrize(
    "read",
    [
        {},
        {"workers_count": 2},
        SHUFFLED,
        {**SHUFFLED, "workers_count": 2},
        {**SHUFFLED, "pad_column": "is_pad"},
        {**SHUFFLED, "global_batch_size": 60},
    ],
    ids=["in-order", "in-order-two-workers", "shuffled", "two-workers", "pads", "global-batch"],
)
def test_wide_and_array_shapes_give_the_same_rows_through_3_2_3(layouts, read, stacked):
    base = reader.ReadOptions(
        batch_size=40, num_epochs=1, writable=True, cur_shard=0, shard_count=1, **read
    )
    wide_options = base
    if stacked:
        wide_options = dataclasses.replace(base, features={"features": FEATURES})
    wide = shard_history(layouts["wide"], wide_options)
    array = shard_history(layouts["array"], base)
    assert len(wide) == len(array) > 5
    seen = []
    for wide_step, array_step in zip(wide, array, strict=True):
        for wide_batch, array_batch in zip(wide_step, array_step, strict=True):
            np.testing.assert_array_equal(wide_batch["id"], array_batch["id"])
            np.testing.assert_array_equal(_features(wide_batch, stacked), array_batch["features"])
            for name in ("label", "weight", "flag", "name", "is_pad", "row_weight"):
                if name in array_batch:
                    np.testing.assert_array_equal(wide_batch[name], array_batch[name])
            keep = ~wide_batch["is_pad"] if "is_pad" in wide_batch else slice(None)
            if "row_weight" in wide_batch:
                keep = wide_batch["row_weight"] > 0
            seen.extend(wide_batch["id"][keep].tolist())
    rows = list(range(sum(map(sum, ROW_GROUPS))))
    if "pad_column" in read or "global_batch_size" in read:
        assert sorted(seen) == rows  # the marks leave out the pads: every row once
    else:
        assert sorted(set(seen)) == rows and len(seen) - len(rows) < 3 * 3  # pads repeat


def test_the_rows_carry_their_own_values_in_every_column(layouts):
    """Each value of a shuffled wide batch is its row's, whatever its width."""
    shard = reader.ShardReader(
        layouts["wide"], batch_size=64, num_epochs=1, writable=True, prefetch=0, **SHUFFLED
    )
    for batch in shard:
        ids = batch["id"]
        expected = _values(ids)  # the row's own values, all but the random matrix
        for name in ("label", "weight", "flag"):
            np.testing.assert_array_equal(batch[name], expected[name])
            assert batch[name].dtype == expected[name].dtype
        assert batch["name"].tolist() == expected["name"].tolist()
        assert list(batch) == ["id", "label", "weight", "flag", "name", *FEATURES]
        for name in FEATURES:
            assert batch[name].flags.c_contiguous and batch[name].flags.writeable


@pytest.fixture(scope="module")
def converter(layouts):
    return SparkDatasetConverter(None, layouts["wide"], source="parquet", tensor_types="torch")


@pytest.mark.parametrize("shuffle", [False, True])
def test_stacked_features_equal_np_stack_numpy_and_torch(converter, shuffle):
    options = {"batch_size": 50, "num_epochs": 1, "cur_shard": 0, "shard_count": 1}
    options.update(SHUFFLED if shuffle else {})
    with converter.make_numpy_batches(**options) as columns:
        expected = [np.stack([b[f] for f in FEATURES], axis=1) for b in columns]
    with converter.make_numpy_batches(features={"x": r"f\d"}, **options) as stacked:
        got = list(stacked)
    assert len(got) == len(expected)
    for batch, want in zip(got, expected, strict=True):
        assert list(batch) == ["id", "label", "weight", "flag", "name", "x"]
        np.testing.assert_array_equal(batch["x"], want)
        assert batch["x"].shape == (len(batch["id"]), 8) and batch["x"].dtype == np.float32
    with converter.make_torch_dataloader(features={"x": FEATURES}, **options) as loader:
        tensors = list(loader)
    for batch, want in zip(tensors, expected, strict=True):
        assert batch["x"].is_contiguous() and tuple(batch["x"].shape) == want.shape
        np.testing.assert_array_equal(batch["x"].numpy(), want)


def test_stacked_features_equal_np_stack_in_tensorflow(converter):
    pytest.importorskip("tensorflow")
    options = {"batch_size": 50, "num_epochs": 1, "cur_shard": 0, "shard_count": 1, **SHUFFLED}
    with converter.make_numpy_batches(**options) as columns:
        expected = [np.stack([b[f] for f in FEATURES], axis=1) for b in columns]
    with converter.make_tf_dataset(
        features={"x": FEATURES}, columns=["id", *FEATURES], **options
    ) as dataset:
        assert dataset.element_spec.x.shape.as_list() == [None, 8]
        got = [batch.x.numpy() for batch in dataset]
    assert len(got) == len(expected)
    for x, want in zip(got, expected, strict=True):
        np.testing.assert_array_equal(x, want)


def test_features_of_different_types_stack_in_their_common_type(converter):
    with converter.make_numpy_batches(
        batch_size=64, num_epochs=1, features={"x": ["label", "f0", "weight"]}, **SHUFFLED
    ) as batches:
        batch = next(iter(batches))
    assert batch["x"].dtype == np.float64  # int32, float32 and float64
    np.testing.assert_array_equal(batch["x"][:, 0], batch["id"] % 10)
    np.testing.assert_array_equal(batch["x"][:, 2], batch["id"] * 0.5)


@pytest.mark.parametrize("shuffle", [False, True])
def test_features_stack_what_a_transform_makes(converter, shuffle):
    def double(frame):
        frame["f9"] = frame["f0"] * 2
        return frame

    spec = TransformSpec(double, edit_fields=[("f9", np.float32, (), False)])
    with converter.make_numpy_batches(
        batch_size=64,
        num_epochs=1,
        shuffle=shuffle,
        transform_spec=spec,
        features={"x": ["f0", "f9"]},
    ) as batches:
        for batch in batches:
            np.testing.assert_array_equal(batch["x"][:, 1], batch["x"][:, 0] * 2)
            assert "f0" not in batch and "f9" not in batch


@pytest.mark.parametrize("shape", ["wide", "array"])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("kind", ["numpy", "torch", "torch features="])
def test_a_batch_held_stays_as_it_was_handed_out(layouts, shape, shuffle, kind):
    """Later batches never reuse a held batch's memory (the window's buffers are reused).

    Batches of 5 rows are views of a decoded piece (16 rows here), not copies.
    """
    converter = SparkDatasetConverter(None, layouts[shape], source="parquet", tensor_types="torch")
    options = {"batch_size": 5, "num_epochs": 2, "shuffle": shuffle, "seed": 3}
    if kind == "torch features=" and shape == "wide":
        options["features"] = {"features": FEATURES}
    make = converter.make_numpy_batches if kind == "numpy" else converter.make_torch_dataloader
    with make(**options) as loader:
        held, copies = [], []
        for index, batch in enumerate(loader):
            if index % 37 == 0:
                held.append(batch)
                copies.append({name: np.array(values, copy=True) for name, values in batch.items()})
    assert len(held) > 10
    for batch, copy in zip(held, copies, strict=True):
        for name, values in batch.items():
            np.testing.assert_array_equal(np.asarray(values), copy[name])


@pytest.mark.parametrize(
    ("features", "message"),
    [
        ({"x": ["f0", "nope"]}, "unknown columns ['nope']"),
        ({"x": r"g\d+"}, "matches no column"),
        ({"x": []}, "names no column"),
        ({"x": ["f0", "name"]}, "only number and boolean columns are stacked"),
        ({"x": ["f0", "f1"], "y": ["f1"]}, "column 'f1' is stacked twice"),
        ({"f2": ["f0", "f1"]}, "'f2' is a column of the data that is not stacked"),
        (["f0", "f1"], "features must map a name to the columns it stacks"),
    ],
)
def test_bad_features_are_refused_when_the_loader_is_made(converter, features, message):
    with pytest.raises(
        (ValueError, TypeError), match=message.replace("[", r"\[").replace("(", r"\(")
    ):
        converter.make_numpy_batches(batch_size=8, features=features)


def test_an_array_column_cannot_be_stacked(layouts):
    array = SparkDatasetConverter(None, layouts["array"], source="parquet")
    with pytest.raises(ValueError, match="an array column is already one array"):
        array.make_numpy_batches(batch_size=8, features={"x": ["features", "weight"]})


DTYPES = ["bool", "int8", "int16", "int32", "int64", "float32", "float64", "uint16"]


@settings(max_examples=60, deadline=None)
@given(
    dtypes=st.lists(st.sampled_from(DTYPES), min_size=1, max_size=12),
    stack=st.lists(st.integers(0, 11), max_size=5, unique=True),
    rows=st.integers(1, 300),
    seed=st.integers(0, 2**16),
)
def test_row_layout_gathers_what_indexing_each_column_gives(dtypes, stack, rows, seed):
    """Columns of any widths put into pieces in a shuffled order (some rows repeated, as
    pads are), a stretch of columns at a time from two stretches of decoded rows, then
    split: each column's own rows, in that order."""
    rng = np.random.default_rng(seed)
    columns = [ColumnInfo(f"c{i}", "scalar", dtype) for i, dtype in enumerate(dtypes)]
    columns.append(ColumnInfo("s", "string", "object"))
    stacked = tuple(f"c{i}" for i in stack if i < len(dtypes))
    stacks = (("x", stacked),) if stacked else ()
    chunk = {
        info.name: (rng.random(rows) * 100).astype(info.dtype)
        for info in columns
        if info.kind == "scalar"
    }
    chunk["s"] = np.array([str(i) for i in range(rows)], dtype=object)
    layout = row_block.RowLayout.of(columns, stacks)
    picked = rng.choice(rows, size=max(rows // 2, 1), replace=bool(seed % 2))
    cuts = [0, len(picked) // 2, len(picked)]  # two pieces
    placement = shuffled.Placement(picked.astype(np.intp), cuts)
    pieces = [
        [np.empty(run.shape(stop - start), run.dtype) for run in layout.runs]
        + [np.empty(stop - start, object)]
        for start, stop in itertools.pairwise(cuts)
    ]
    half = [name for name in layout.decode_order if name in chunk][: len(chunk) // 2]
    cut = rows // 3  # a stretch of columns, then the rest, in two stretches of rows
    for start, stop in ((0, cut), (cut, rows)):
        targets = [(pieces[index], place) for index, place in placement.of(start, stop - start)]
        for names in (half, [name for name in chunk if name not in half]):
            part = {name: chunk[name][start:stop] for name in names}
            layout.fill([(tuple(piece[:-1]), place) for piece, place in targets], part)
            if "s" in part:
                for piece, place in targets:
                    row_block.placed(part["s"], place, piece[-1])
    parts = [layout.split(tuple(piece[:-1]), {"s": piece[-1]}) for piece in pieces]
    out = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
    expected = row_block.stack_features(
        {name: values[picked] for name, values in chunk.items()},
        stacks,
        row_block.stacked_columns(columns, stacks),
    )
    assert list(out) == list(expected)
    for name, values in expected.items():
        assert all(part[name].flags.c_contiguous for part in parts)
        assert out[name].dtype == values.dtype
        np.testing.assert_array_equal(out[name], values)


def test_decode_threads_default_to_the_ranks_share_of_the_cores(monkeypatch):
    cores = len(os.sched_getaffinity(0))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert reader.decode_threads(3) == 3  # given: as given
    assert reader.decode_threads(None) == max(1, min(reader.DEFAULT_THREADS_MAX, cores))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores))  # a rank a core: one thread each
    assert reader.decode_threads(None) == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert reader.decode_threads(None, loader_workers=cores) == 1  # DataLoader processes


def _read_counting_buffers(layout, **options) -> tuple[np.ndarray, int]:
    """(the ids read, how many piece slabs the reader made, not taken from its free list)."""
    shard = reader.ShardReader(layout, **options)
    made = []
    original = shard._pieces.carver

    def carver(nbytes: int):
        free = len(shard._pieces.free)
        out = original(nbytes)
        if len(shard._pieces.free) >= free:  # none was taken: a new one
            made.append(nbytes)
        return out

    shard._pieces.carver = carver  # prefetch=0: the reading thread is this one
    return np.concatenate([batch["id"] for batch in shard]), len(made)


@pytest.mark.parametrize("shuffle", [False, True])
def test_decode_threads_share_one_window_and_end_with_the_iteration(layouts, shuffle):
    """Four threads read the rows one thread reads, with the memory one thread makes and
    the pieces they hand ahead (they share a window, not a window each), and are gone
    when the iteration ends, read through or abandoned."""

    def decode_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("sparkdist-data-decode")]

    options = {"batch_size": 64, "num_epochs": 1, "writable": True, "prefetch": 0, **SHUFFLED}
    options["shuffle"] = shuffle
    one, one_made = _read_counting_buffers(layouts["wide"], workers_count=1, **options)
    four, four_made = _read_counting_buffers(layouts["wide"], workers_count=4, **options)
    np.testing.assert_array_equal(four, one)
    assert one_made <= four_made <= one_made + 2 * 4 and (four_made >= 1) == shuffle
    assert not decode_threads()
    abandoned = iter(reader.ShardReader(layouts["wide"], workers_count=4, **options))
    next(abandoned)
    abandoned.close()  # a loop left early: the generator is closed
    assert not decode_threads()


@pytest.mark.parametrize("shuffle", [False, True])
def test_torch_batches_are_views_of_the_decoded_chunks(converter, shuffle):
    """A batch's tensors share the decoded chunk's memory (a batch's rows follow the one
    before in the same chunk), not copies; the batches are still each their own rows."""
    options = {"batch_size": 5, "num_epochs": 1, "shuffle": shuffle, "seed": 3}
    with converter.make_torch_dataloader(**options) as loader:
        batches = list(loader)
    starts = [batch["f0"].data_ptr() for batch in batches]
    following = sum(after == before + 5 * 4 for before, after in itertools.pairwise(starts))
    assert following * 2 >= len(batches)  # 12 batches a chunk, 3 a shuffled piece
    ids = np.concatenate([batch["id"].numpy() for batch in batches])
    assert sorted(ids.tolist()) == list(range(sum(map(sum, ROW_GROUPS))))


@pytest.mark.parametrize("shuffle", [False, True])
def test_torch_batches_wait_as_numpy_not_as_tensors(converter, monkeypatch, shuffle):
    """Tensors, unlike numpy arrays, are tracked by Python's garbage collector: the loader
    holds fewer of them than the collector's first threshold, so that none outlives a
    collection of the young (a chunk's 350 batches cut ahead as tensors were 4,550 of
    them, promoted, and collections of the whole heap followed). The rows are still each
    read once."""
    monkeypatch.setattr(reader, "CHUNK_BYTES", 8 << 20)  # a row group a chunk
    torch = pytest.importorskip("torch")

    def live_tensors() -> int:
        return sum(issubclass(type(value), torch.Tensor) for value in gc.get_objects())

    before = live_tensors()
    options = {"batch_size": 2, "num_epochs": 1, "shuffle": shuffle, "seed": 3}
    ids, most = [], 0
    with converter.make_torch_dataloader(**options) as loader:
        for index, batch in enumerate(loader):
            ids += batch["id"].tolist()
            if index % 150 == 10:
                most = max(most, live_tensors() - before)
    assert 12 <= most < gc.get_threshold()[0]  # at least this batch's 12 (names are a list)
    assert sorted(ids) == list(range(sum(map(sum, ROW_GROUPS))))


def test_shuffled_pieces_end_on_whole_batches(layouts, monkeypatch):
    """A shuffled window's pieces end where the epoch's rows reach a multiple of a piece
    (whole batches): a batch that spans two pieces, a copy of every column, comes at most
    once a window, not once a piece."""
    from sparkdist.data.rank import batches as batches_module

    joined, windows = [], []
    join = batches_module._join
    monkeypatch.setattr(batches_module, "_join", lambda parts: joined.append(1) or join(parts))
    plan = shuffled.plan_window

    def counted(*args, **kwargs):
        windows.append(1)
        return plan(*args, **kwargs)

    monkeypatch.setattr(shuffled, "plan_window", counted)
    options = {**SHUFFLED, "shuffle_buffer_rows": 2000}  # windows of many pieces
    shard = reader.ShardReader(layouts["wide"], batch_size=7, num_epochs=1, prefetch=0, **options)
    batches = list(shard)
    assert len(batches) > 8 * len(windows)  # several pieces a window (2 batches a piece)
    assert len(joined) <= len(windows)


def test_a_row_groups_column_groups_are_of_equal_bytes_one_a_thread(layouts):
    """A shuffled window's row group is decoded in column groups of about equal bytes, at
    least one a decode thread (a chunk's worth and a remainder kept a thread waiting)."""
    shard = reader.ShardReader(layouts["wide"], batch_size=5, **SHUFFLED)
    from sparkdist.data.rank.order import Block

    block = Block(0, 0, 40, 0)  # decoded a column group at a time (chunks of 60 rows)
    widest = max(decode.width(info) for info in shard._decoding.columns)
    for threads in (1, 2, 3, 4):
        decoder = dataclasses.replace(shard._decoding, threads=threads)
        groups = shuffled.column_groups(decoder, block)
        assert len(groups) >= threads
        names = [info.name for group in groups for info in group]
        assert names == list(decoder.row_layout.decode_order)  # each column once, in order
        sizes = [sum(decode.width(info) for info in group) for group in groups]
        assert max(sizes) - min(sizes) <= 2 * widest


def test_every_batch_of_a_shuffled_epoch_stays_as_it_was_handed_out(layouts, monkeypatch):
    """Two decode threads decode the next window into the scratch while the pieces of
    this one are still handed out: no batch held, of any window, is written over."""
    monkeypatch.setattr(reader, "CHUNK_BYTES", 1024)  # pieces of 4 rows: many a window
    options = {**SHUFFLED, "shuffle_buffer_rows": 300, "workers_count": 2, "num_epochs": 2}
    shard = reader.ShardReader(layouts["wide"], batch_size=4, writable=True, **options)
    held, copies = [], []
    for batch in shard:
        held.append(batch)
        copies.append({name: np.array(values, copy=True) for name, values in batch.items()})
    rows = sum(map(sum, ROW_GROUPS))
    assert sum(len(batch["id"]) for batch in held) == 2 * rows
    for batch, copy in zip(held, copies, strict=True):
        for name, values in batch.items():
            np.testing.assert_array_equal(values, copy[name])
        np.testing.assert_array_equal(batch["label"], batch["id"] % 10)  # each row its own


def test_the_next_window_is_decoded_while_this_ones_last_pieces_wait(layouts, monkeypatch):
    """Once a window's last piece is gathered, the next window is decoded on the decode
    threads, though the reading thread (here the consumer's: prefetch=0) has not yet
    handed out this window's last pieces nor asked for the next window."""
    decoded: list[threading.Event] = []
    plan = shuffled.plan_window

    def planned(*args, **kwargs):
        window = plan(*args, **kwargs)
        done, left, lock = threading.Event(), [len(window.tasks)], threading.Lock()
        decoded.append(done)

        @dataclasses.dataclass(frozen=True)
        class Counted(shuffled.DecodeTask):
            def run(self, *args):
                footer = super().run(*args)
                with lock:  # the last of the window's tasks sets the event
                    left[0] -= 1
                    if not left[0]:
                        done.set()
                return footer

        counted = [Counted(**vars(task)) for task in window.tasks]
        return dataclasses.replace(window, tasks=counted)

    monkeypatch.setattr(shuffled, "plan_window", planned)
    options = {**SHUFFLED, "workers_count": 2, "num_epochs": 1, "prefetch": 0}
    shard = reader.ShardReader(layouts["wide"], batch_size=8, **options)
    first = order.EpochOrder(shard.layout.row_group_rows, 7, 0, True, 600).windows[0].rows
    batches, taken = iter(shard), 0
    while taken <= first - 16:  # into the window's last piece (pieces of 16 rows here)
        taken += len(next(batches)["id"])
    assert taken <= first and len(decoded) == 2
    assert decoded[1].wait(timeout=60), "the next window was not decoded ahead"
    assert taken + sum(len(batch["id"]) for batch in batches) == sum(map(sum, ROW_GROUPS))


@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "in-order"])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_decoding_error_in_a_later_window_reaches_the_loop(tmp_path, workers, shuffle):
    """A window decoded ahead by the decode threads that fails (a null here) raises in
    the training loop, in the epoch's order, and leaves no decode thread behind (read in
    order, the threads stream the row groups ahead, a group of the columns each)."""
    values = np.arange(400, dtype=np.float32)
    column = pa.array(values, mask=np.arange(400) == 399)  # the last row group's last row
    write_row_groups(tmp_path / "part-0.parquet", pa.table({"id": values, "x": column}), [100] * 4)
    layout = describe(tmp_path.as_uri())
    options = {"shuffle": shuffle, "seed": 0, "shuffle_buffer_rows": 100}  # a row group a window
    shard = reader.ShardReader(
        layout, batch_size=10, num_epochs=1, workers_count=workers, **options
    )
    windows = order.EpochOrder(layout.row_group_rows, 0, 0, shuffle, 100).windows
    failing = [window.blocks[0].row_group for window in windows].index(3)  # the last, here
    read = []
    with pytest.raises(ValueError, match="column 'x' has null values"):
        for batch in shard:
            read.extend(batch["id"].tolist())
    assert failing == 3 and len(read) == 300  # every window before it, whole
    assert not [t for t in threading.enumerate() if t.name.startswith("sparkdist-data-decode")]
