"""One rank's batches of the Parquet files, epoch after epoch, from a resumable position.

Which rows, in which order, is `sparkdist.data.rank.order`: rank ``r`` of ``W`` reads its equal
slice of each epoch's global order, from a position that survives relaunches and
resizes; what a reader reads of each epoch is planned there too (`order.EpochPlans`).
`ShardReader` starts an iteration (its place in the world, its position) and hands out
its batches: decoding the windows of the plans into numpy chunks of about 8 MiB is
`sparkdist.data.rank.epochs` (in order `sparkdist.data.rank.decode`, shuffled
`sparkdist.data.rank.shuffled`, where ``workers_count`` threads share each window);
cutting them into batches, the thread that reads ``prefetch`` chunks ahead and the
counting of the batches handed out, `sparkdist.data.rank.batches`; which rank of how
many reads, and how that follows a change of the world, `sparkdist.data.rank.rank_place`.
What a rank is asked for travels as one `ReadOptions`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkdist.data.layout import ColumnInfo, Layout
from sparkdist.data.rank import decode_processes, order, rank_place, row_block
from sparkdist.data.rank.batches import counted, prefetched, rebatch_runs
from sparkdist.data.rank.decode import Chunk, WindowDecoder
from sparkdist.data.rank.epochs import Marks, iteration_chunks
from sparkdist.data.rank.piece_memory import PieceMemory
from sparkdist.data.rank.transform import TransformSpec
from sparkdist.protocol.driver_channel import steps

logger = logging.getLogger(__name__)

# Uncompressed bytes a rank decodes at once from a row group read in file order.
CHUNK_BYTES = 8 << 20

# The most decode threads a reader takes by default (beyond, a rank's decoding is not the
# bound: docs/data.md, "Wide tables").
DEFAULT_THREADS_MAX = 4

# The loaders' batches handed out: a sign of life, and the step rate stragglers are named by.
_BATCHES = steps("batches")


@dataclass(frozen=True)
class ReadOptions:
    """What a rank is asked to read, as one value from a loader call to the readers.

    The fields are the loaders' arguments of the same names
    (`SparkDatasetConverter.make_torch_dataloader`): a new reading option is one field
    here. Made, the shard is known (env RANK / WORLD_SIZE by default) and
    ``transform_spec`` is a `TransformSpec` (petastorm's class is taken too).
    ``shuffling_queue_capacity`` is petastorm's knob: it shuffles too. ``writable`` hands
    out memory that torch may write to. ``pad_column`` names a boolean column added to
    every batch, True on the rows repeated to keep the steps equal (a metric leaves them
    out). ``global_batch_size`` makes a step that many rows for the whole world, whatever
    its size (`order.GlobalSplit`); the batches then carry ``weight_column``, each row's
    weight in the step's mean (`global_weights`); ``rank_split="per_step"`` makes a step's
    rows the same whatever the world's size (`order.per_step_rank_slice`). ``features``
    stacks named scalar columns into one ``[batch, k]`` array each
    (`row_block.resolve_stacks`).
    """

    batch_size: int = 32
    num_epochs: int | None = None
    shuffle: bool = False
    cur_shard: int | None = None
    shard_count: int | None = None
    seed: int | None = None
    drop_last: bool = False
    shuffle_buffer_rows: int | None = None
    shuffling_queue_capacity: int = 0
    transform_spec: Any = None
    columns: Sequence[str] | None = None
    prefetch: int = 2
    workers_count: int | None = None
    decode_processes: bool = False  # petastorm's reader_pool_type="process"
    writable: bool = False
    pad_column: str | None = None
    global_batch_size: int | None = None
    weight_column: str = "row_weight"
    rank_split: str = "contiguous"
    features: Any = None  # {name: [columns] or a pattern}, kept as (name, columns) pairs
    # Whether the shard is the environment's (`rank_place.default_shard`): the reader then
    # follows the environment's place from iteration to iteration.
    follows_env: bool = dataclasses.field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        shard = rank_place.default_shard(self.cur_shard, self.shard_count)
        object.__setattr__(self, "cur_shard", shard[0])
        object.__setattr__(self, "shard_count", shard[1])
        object.__setattr__(self, "follows_env", shard[2])
        object.__setattr__(self, "transform_spec", TransformSpec.of(self.transform_spec))
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        if self.num_epochs is not None and self.num_epochs < 1:
            raise ValueError(
                f"num_epochs must be None (forever) or at least 1, got {self.num_epochs}"
            )
        if self.workers_count is not None and self.workers_count < 1:
            raise ValueError(f"workers_count must be None or at least 1, got {self.workers_count}")
        order.check_global_batch(self.global_batch_size, self.shard_count)
        order.check_rank_split(self.rank_split, self.global_batch_size)
        object.__setattr__(self, "features", row_block.frozen_features(self.features))

    @classmethod
    def of(
        cls, arguments: Mapping[str, Any], skip: Sequence[str] = (), **overrides: Any
    ) -> ReadOptions:
        """The options among a loader's ``arguments`` (its ``locals()``), but ``skip``."""
        names = {field.name for field in dataclasses.fields(cls)} - set(skip)
        given = {name: value for name, value in arguments.items() if name in names}
        return cls(**{**given, **overrides})

    @property
    def shuffled(self) -> bool:
        return self.shuffle or bool(self.shuffling_queue_capacity)

    @property
    def window_rows(self) -> int:
        """Rows mixed together when shuffling (see `sparkdist.data.rank.order`)."""
        buffer = self.shuffle_buffer_rows or self.shuffling_queue_capacity
        return buffer or order.DEFAULT_WINDOW_ROWS


def decode_threads(workers_count: int | None, loader_workers: int = 1) -> int:
    """A reader's decode threads: ``workers_count`` if given, else the rank's share of the
    cores it may run on (env LOCAL_WORLD_SIZE ranks share a machine, ``loader_workers``
    DataLoader processes a rank), at most `DEFAULT_THREADS_MAX`. The threads share each
    window's work, so more of them take no more memory."""
    if workers_count is not None:
        return workers_count
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        ranks = max(int(os.environ.get("LOCAL_WORLD_SIZE") or 1), 1)
    except ValueError:
        ranks = 1
    return max(1, min(DEFAULT_THREADS_MAX, (cores or 1) // (ranks * max(loader_workers, 1))))


def log_shares(position: order.Position, column: str) -> None:
    """Say how a global batch that the world does not split evenly is shared."""
    size, world = position.global_batch_size, position.world
    if size is None or size % world == 0:
        return
    base, extra = divmod(size, world)
    logger.info(
        "sparkdist.data: global_batch_size=%d over %d ranks: ranks 0..%d read %d rows a "
        "step, ranks %d..%d read %d (the batches' %r weights make the loss the step's mean)",
        size,
        world,
        extra - 1,
        base + 1,
        extra,
        world - 1,
        base,
        column,
    )


class ShardReader:
    """Iterable over one rank's batches ({column: numpy array}), epoch after epoch.

    Each iteration reads ``num_epochs`` epochs (``None``: forever) from `position`, the
    world's place in the data (see `sparkdist.data.rank.order`): rank ``cur_shard`` of
    ``shard_count`` reads its equal slice of what is left of each epoch's global order.
    The last batch of an epoch can be short (the same length on every rank); batches never
    span two epochs. ``shuffle`` draws a new global order each epoch from ``seed``, with
    rows mixed within windows of ``shuffle_buffer_rows``. ``workers_count`` threads share
    the decoding of each window (default: the rank's share of the cores, `decode_threads`);
    ``transform_spec`` (a `TransformSpec`) is applied to each decoded chunk as a pandas
    DataFrame.
    """

    def __init__(self, layout: Layout, options: ReadOptions | None = None, **fields: Any) -> None:
        """Read ``layout`` with ``options``, or with `ReadOptions` ``fields`` as keywords."""
        if options is None:
            options = ReadOptions(**fields)
        elif fields:
            options = dataclasses.replace(options, **fields)
        self.options, self.layout = options, layout
        self.batch_size, self.num_epochs = options.batch_size, options.num_epochs
        self.columns, transformed = _columns(layout, options)  # read, and made by the transform
        self.stacks = row_block.resolve_stacks(options.features, transformed)
        self.output_columns = row_block.stacked_columns(transformed, self.stacks)
        self.batch_columns = self.output_columns + _added_columns(self.output_columns, options)
        self.position = order.Position(
            layout.num_rows,
            seed=0 if options.seed is None else int(options.seed),
            rank=options.cur_shard,
            world=options.shard_count,
            batch_size=self.batch_size,
            drop_last=options.drop_last,
            global_batch_size=options.global_batch_size,
            rank_split=options.rank_split,
        )
        log_shares(self.position, self.options.weight_column)
        if self.num_epochs is None and self.position.batches_in_epoch() == 0:
            raise ValueError(
                f"rank {options.cur_shard} of {options.shard_count} has no rows (the data has "
                f"{layout.num_rows}), so num_epochs=None would never yield a batch"
            )
        self._closed = threading.Event()
        # A shuffled read's pieces, reused once dropped (shared with decode processes).
        self._pieces = PieceMemory(shared=options.decode_processes)
        self._decoding = self._decoder(transformed)
        self._said_threads = False  # that decode processes could not be used
        self._marks = Marks(
            options.weight_column if options.global_batch_size else None, options.pad_column
        )
        self._iterations: weakref.WeakSet = weakref.WeakSet()
        self._started: order.Position | None = None  # where the current iteration began
        self._taken: order.Position | None = None  # an `iteration_apart`'s own count

    @property
    def rows_in_shard(self) -> int:
        """Rows this rank reads in the current epoch (the same on every rank)."""
        return order.total(self.position.slice())

    def batches_per_epoch(self) -> int:
        """Batches each rank gets in the current epoch (from the current position)."""
        return self.position.batches_in_epoch()

    def batches_per_iteration(self, start: order.Position | None = None) -> int:
        """Batches one iteration yields from ``start`` (default: the current position)."""
        if self.num_epochs is None:
            raise TypeError("num_epochs=None repeats forever: the loader has no length")
        return (start or self.position).batches_in_epochs(self.num_epochs)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        # Thread state, and the iterations in progress: a copy (a DataLoader worker's) has its own.
        state["_closed"] = state["_iterations"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._closed = threading.Event()
        self._iterations: weakref.WeakSet = weakref.WeakSet()

    def state_dict(self, steps: int | None = None) -> dict:
        """The world's position (epoch, rows consumed, seed): small, picklable.

        By default, after the batches handed out so far. ``steps=n``: after the first ``n``
        batches of the current iteration (of the next one, if none has started), whatever
        was taken ahead of them: exact where a pipeline such as tf.data's prefetch takes
        batches before the training step uses them.
        """
        if steps is None:
            return (self._taken or self.position).state_dict()
        start = self._started or self.position
        limit = None if self.num_epochs is None else self.batches_per_iteration(start)
        if steps < 0 or (limit is not None and steps > limit):
            raise ValueError(
                f"steps={steps}: an iteration of this loader has "
                f"{'unlimited' if limit is None else limit} batches"
            )
        position = start.copy()
        position.settle()
        for _ in self._counted(itertools.repeat(None, steps), position):
            pass
        return position.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (from `state_dict`, any world size) at the next iteration."""
        self.position.load_state_dict(state)
        self._started = self._taken = None

    def on_world_change(self, rank: int, world_size: int) -> None:
        """Read as rank ``rank`` of ``world_size`` from the next iteration on (an in-process
        change of the world), before or after `load_state_dict`: the position stays as
        `state_dict` reports it (`Position.for_world`); an iteration in progress ends."""
        rank, world_size = rank_place.check_place(rank, world_size)
        for iteration in list(self._iterations):
            iteration.close()
        self.position = (self._taken or self.position).for_world(rank, world_size)
        self._started = self._taken = None
        log_shares(self.position, self.options.weight_column)

    def follow_world(self) -> None:
        """Take the environment's new place, if the loader follows it (`rank_place`)."""
        if not self.options.follows_env:
            return
        moved = rank_place.moved(self.position.rank, self.position.world)
        if moved:
            self.on_world_change(*moved)

    def close(self) -> None:
        """Stop every iteration in progress (their background threads end)."""
        self._closed.set()

    # -- producing (may run in a background thread or a DataLoader worker) --

    def _decoder(self, transformed: list[ColumnInfo]) -> WindowDecoder:
        chunk_rows = max(self.batch_size, CHUNK_BYTES // max(self.layout.row_bytes, 1), 1)
        # Whole batches a piece (a quarter chunk, shuffled): a batch across two pieces is
        # a copy of every column (a tenth of a wide table's cutting), one within is views.
        unit = 4 * self.batch_size
        if chunk_rows >= unit:
            chunk_rows = -(-chunk_rows // unit) * unit
        return WindowDecoder(
            self.layout,
            self.columns,
            transformed,
            self.output_columns,
            self.options.transform_spec,
            self.options.writable,
            chunk_rows,
            self.stacks,
        )

    def batches(
        self,
        worker: int = 0,
        workers: int = 1,
        start: order.Position | None = None,
        convert: Callable[[Chunk], Chunk] | None = None,
        feed: Any = None,
    ) -> Iterator[Chunk]:
        """This worker's batches of one iteration, cut from its chunks (after ``convert``,
        e.g. to petastorm's types; see `rebatch`).

        With ``prefetch``, a thread reads and decodes the chunks ahead and cuts them into
        batches (`rebatch_runs`): the threads meet once per chunk (its batches handed over
        as one list), and the consumer's thread, the training loop's, does no cutting.
        A ``feed`` (`sparkdist.data.rank.device_feed.ChunkFeed`) gives the decode threads
        its memory to gather into and moves each chunk to the device before it is cut
        (`ChunkFeed.runs`; its items are then `Handed` batches).
        """
        options, start = self.options, start or self.position
        plans = order.EpochPlans(
            start,
            self.layout.row_group_rows,
            options.shuffled,
            options.window_rows,
            worker,
            workers,
        )
        size = start.rank_batch_size()
        threads = decode_threads(options.workers_count, workers)
        memory = feed.memory if feed is not None else None
        processes = _in_processes(self)
        chunks = functools.partial(
            iteration_chunks,
            dataclasses.replace(
                self._decoding, threads=threads, memory=memory, processes=processes
            ),
            itertools.islice(plans, self.num_epochs),  # None: for ever
            self._pieces,
            self._marks,
            convert,
        )
        cut = rebatch_runs if feed is None else feed.runs
        if options.prefetch >= 1:
            runs = lambda: cut(chunks(), size)  # noqa: E731
            return itertools.chain.from_iterable(prefetched(runs, options.prefetch, self._closed))
        return itertools.chain.from_iterable(cut(chunks(), size))

    # -- consuming (counts what the user got, for state_dict) --

    def count(
        self,
        open_batches: Callable[[], Iterator],
        wrap: Callable[[Iterator], Iterator] | None = None,
    ) -> Iterator[Any]:
        """Start an iteration of ``open_batches()`` (``wrap``ped, if given): the reader takes
        the world's place and folds in what was handed out first (before a DataLoader's
        workers copy it), then moves the position one batch at a time as they are handed out.
        """
        self.follow_world()
        self._started = self.position.started()
        in_epoch = self.position.batches_in_epoch()
        batches = open_batches()
        iteration = self._counted(wrap(batches) if wrap else batches, self.position, in_epoch)
        self._iterations.add(iteration)  # ended at a change of the world
        return iteration

    def _counted(
        self, batches: Iterator[Any], position: order.Position, in_epoch: int | None = None
    ) -> Iterator[Any]:
        if in_epoch is None:
            in_epoch = position.batches_in_epoch()
        return counted(batches, position, self.num_epochs, _BATCHES, in_epoch)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for batch in self.count(self.batches):
            if self._closed.is_set():
                return
            yield batch

    def iteration_apart(self) -> Iterator[dict[str, np.ndarray]]:
        """One iteration that moves the position only if it runs to its end (for tf.data).

        tf.data takes batches ahead, and tf.distribute and Keras drop an iterator after
        taking some to look at a dataset: the next iteration starts where such a one did,
        so no row is skipped. It counts on its own; `state_dict(steps=n)` counts from its
        start, and a later iteration supersedes it.
        """
        self.follow_world()
        start = self.position.copy()
        start.settle()
        taken = start.copy()
        self._started, self._taken = start, taken
        for batch in self._counted(self.batches(start=start), taken):
            if self._closed.is_set():
                return
            yield batch
        if self._taken is taken:  # still the latest iteration, and it ran to its end
            self.position, self._started, self._taken = taken, None, None


def _columns(layout: Layout, options: ReadOptions) -> tuple[tuple, list]:
    """(the stored columns to decode, the columns that come out), checked against the data."""
    known = {info.name: info for info in layout.columns}
    columns, transform = options.columns, options.transform_spec
    if columns is not None:
        missing = [name for name in columns if name not in known]
        if missing:
            raise ValueError(f"unknown columns {missing}; the data has {sorted(known)}")
        if not columns:
            raise ValueError("columns=[] selects nothing; give at least one column, or None")
    if transform is not None:
        columns = transform.input_columns(columns or list(known), known)
    stored = tuple(known[name] for name in (columns or known))
    return stored, transform.output_columns(stored) if transform else list(stored)


def _added_columns(output: list[ColumnInfo], options: ReadOptions) -> list[ColumnInfo]:
    """The columns the batches carry besides the data's: ``weight_column``, ``pad_column``."""
    added = []
    if options.global_batch_size is not None:
        added.append(("weight_column", ColumnInfo(options.weight_column, "scalar", "float32")))
    if options.pad_column is not None:
        added.append(("pad_column", ColumnInfo(options.pad_column, "scalar", "bool")))
    known = {info.name for info in output}
    for option, info in added:
        if info.name in known:
            raise ValueError(
                f"{option} {info.name!r} is a column of the data; name the added column "
                f"something new, e.g. {option}='{'is_pad' if option == 'pad_column' else 'w'}'"
            )
    return [info for _, info in added]


class ReaderPosition:
    """A loader's position, from the `ShardReader` it reads (``self.reader``).

    Shared by the torch loader and the numpy batches; ``len()`` is the number of batches
    one iteration yields from the current position, the same on every rank.
    """

    reader: ShardReader

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self.reader.position.epoch

    @property
    def rows_in_shard(self) -> int:
        """Rows this rank reads in the current epoch (the same on every rank)."""
        return self.reader.rows_in_shard

    def __len__(self) -> int:
        self.reader.follow_world()
        return self.reader.batches_per_iteration()

    def state_dict(self, steps: int | None = None) -> dict:
        """The world's position: epoch, rows consumed, seed, what is left. Picklable.

        After the batches handed out so far, or after the iteration's first ``steps``.
        """
        return self.reader.state_dict(steps)

    def load_state_dict(self, state: dict) -> None:
        """Continue from a `state_dict` (saved by a world of any size) on the next ``iter``."""
        self.reader.load_state_dict(state)

    def on_world_change(self, rank: int, world_size: int) -> None:
        """Read as rank ``rank`` of ``world_size`` from the next ``iter`` (in-process elastic).

        What the world has read stays; the rest of the epoch is split over the new world.
        A loader whose place came from env RANK / WORLD_SIZE also follows them by itself.
        """
        self.reader.on_world_change(rank, world_size)


class ReaderContext:
    """What the converter's ``make_*`` return: a `ShardReader` of ``layout`` with
    ``options``; ``with`` gives ``make(reader=reader)``; exit stops the reader."""

    def __init__(self, layout: Layout, options: ReadOptions, make: Callable[..., Any]) -> None:
        self.reader, self._make = ShardReader(layout, options), make

    def __enter__(self) -> Any:
        return self._make(reader=self.reader)  # petastorm passes the reader by keyword

    def __exit__(self, *exc_info: object) -> None:
        self.reader.close()


def _in_processes(shard: ShardReader) -> bool:
    """Whether an iteration of ``shard`` decodes in processes (`decode_processes`): asked
    for, and possible here; else in threads, and why is said once."""
    if not shard.options.decode_processes:
        return False
    why = decode_processes.usable()
    strings = [info.name for info in shard.columns if info.kind in ("string", "binary")]
    if why is None and strings:
        why = f"string and binary columns ({strings}) are Python objects, not shared memory"
    if why is not None and not shard._said_threads:
        logger.info("sparkdist.data: reader_pool_type='process': %s; decoding in threads", why)
        shard._said_threads = True
    return why is None
