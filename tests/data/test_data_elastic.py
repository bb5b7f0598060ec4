"""A loader follows an in-process world change: 3 -> 2 -> 3 ranks mid-epoch, rows read once.

Under `sparkdist.elastic.run` the rank processes and their loaders live on through a change
of the world: the loader's position (`state_dict()`, the world's, the same on every rank at a
commit) comes back from the last commit, and the loader takes its new place (rank, world
size) from ``on_world_change`` or from env RANK / WORLD_SIZE when its next iteration starts.
Then it reads what no rank of the committed position read, split equally over the new world.
Real Spark DataFrame -> converter -> torch loaders; first several worlds simulated in one
process, then real rank processes exchanging positions over gloo.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter

import pytest

from sparkdist import HorovodRunner

N_ROWS = 1001
LOADER = {"batch_size": 20, "num_epochs": 1, "shuffle": True, "seed": 3, "pad_column": "is_pad"}


def converter_frame(spark):
    """The rows of this module's `converter` (tests/helpers.py)."""
    return spark.range(N_ROWS).selectExpr("id", "cast(id as double) as x").repartition(4)


@contextlib.contextmanager
def rank_env(rank: int, world: int):
    """This process's RANK / WORLD_SIZE for a moment, as `elastic.run` sets them."""
    saved = {name: os.environ.get(name) for name in ("RANK", "WORLD_SIZE")}
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class SimulatedRank:
    """One rank's loader in a world simulated in this process.

    ``follow="method"``: the loader reads an explicit shard and is told of a change by
    ``on_world_change``; ``"env"``: it takes its shard from RANK / WORLD_SIZE, which are set
    to this rank's place whenever it starts an iteration (as they are in its own process).
    """

    def __init__(self, stack, converter, rank: int, world: int, follow: str, **kwargs) -> None:
        self.place, self.follow = (rank, world), follow
        shard = {} if follow == "env" else {"cur_shard": rank, "shard_count": world}
        with rank_env(rank, world) if follow == "env" else contextlib.nullcontext():
            opened = converter.make_torch_dataloader(**LOADER, **shard, **kwargs)
            self.loader = stack.enter_context(opened)
        self.batches = None

    def change(self, rank: int, world: int) -> None:
        self.place = (rank, world)
        if self.follow == "method":
            self.loader.on_world_change(rank, world)

    def start(self) -> None:
        """A new iteration (on every (re)entry of the training function)."""
        with rank_env(*self.place) if self.follow == "env" else contextlib.nullcontext():
            old, self.batches = self.batches, iter(self.loader)
        if old is not None:  # the iteration of the old world has ended
            assert next(old, None) is None

    def step(self) -> list[tuple[int, bool]] | None:
        batch = next(self.batches, None)
        if batch is None:
            return None
        return list(zip(batch["id"].tolist(), batch["is_pad"].tolist(), strict=True))


def lockstep(ranks: list[SimulatedRank], steps: int | None) -> tuple[list, dict]:
    """``steps`` steps (None: to the epoch's end) of every rank, each followed by a commit.

    Returns the rows read and the committed position, checked to be the same on every rank.
    """
    read, commit = [], None
    while steps is None or steps > 0:
        got = [rank.step() for rank in ranks]
        if all(rows is None for rows in got):
            break
        assert None not in got, "equal steps: every rank has a batch, or none has"
        assert len({len(rows) for rows in got}) == 1  # the same batch length on every rank
        read += [row for rows in got for row in rows]
        positions = [rank.loader.state_dict() for rank in ranks]
        assert all(position == positions[0] for position in positions)  # the world's
        commit = positions[0]
        steps = None if steps is None else steps - 1
    return read, commit


@pytest.mark.parametrize(
    ("follow", "num_workers", "device"),
    [("method", 0, None), ("env", 0, None), ("method", 2, None), ("method", 0, "cpu")],
    ids=str,
)
def test_rows_are_read_once_across_3_2_3_ranks_in_one_process(
    converter, follow, num_workers, device
):
    """device="cpu": the batches go through the device feed's ring (packed, copied, views)."""
    kwargs = {"num_workers": num_workers} if num_workers else {}
    kwargs.update({"device": device, "device_feed": "ring"} if device else {})
    with contextlib.ExitStack() as stack:
        ranks = [SimulatedRank(stack, converter, r, 3, follow, **kwargs) for r in range(3)]
        for rank in ranks:
            rank.start()
        read, commit = lockstep(ranks, 4)

        # A rank is lost mid-step: the survivors had read their next batch, the step fails
        # and is redone: they restore the commit and follow the world of 2.
        survivors = ranks[:2]
        assert all(rank.step() for rank in survivors)
        for new_rank, rank in enumerate(survivors):
            rank.loader.load_state_dict(commit)
            rank.change(new_rank, 2)
            assert rank.loader.state_dict() == commit  # the position is the world's
            rank.start()
        assert len({len(rank.loader) for rank in survivors}) == 1
        more, commit = lockstep(survivors, 5)
        read += more

        # A grow at a commit: world rank 0 keeps its own state (no restore after a commit),
        # the others get the commit by its broadcast, the newcomer opens a fresh loader.
        newcomer = SimulatedRank(stack, converter, 2, 3, follow, **kwargs)
        newcomer.loader.load_state_dict(commit)
        survivors[1].loader.load_state_dict(commit)
        for new_rank, rank in enumerate(survivors):
            rank.change(new_rank, 3)
        grown = [*survivors, newcomer]
        for rank in grown:
            assert rank.loader.state_dict() == commit
            rank.start()
        rest, commit = lockstep(grown, None)
        read += rest

        kept = Counter(i for i, pad in read if not pad)
        assert sorted(kept) == list(range(N_ROWS)) and set(kept.values()) == {1}
        assert commit["epoch"] == 1 and all(rank.loader.epoch == 1 for rank in grown)

        # The next epoch, in the world of 3: each row once again.
        for rank in grown:
            rank.start()
        epoch, _ = lockstep(grown, None)
        kept = Counter(i for i, pad in epoch if not pad)
        assert sorted(kept) == list(range(N_ROWS)) and set(kept.values()) == {1}


def test_a_change_leaves_the_position_and_splits_the_rest(converter):
    """Without a restore (a change right after a commit), the batches handed out count."""
    with converter.make_numpy_batches(**LOADER, cur_shard=1, shard_count=3) as batches:
        iterator = iter(batches)
        for _ in range(3):
            next(iterator)
        before = batches.state_dict()
        assert before["rows_consumed"] == 3 * 3 * 20
        batches.on_world_change(0, 2)
        assert batches.state_dict() == before
        assert batches.rows_in_shard == -(-(N_ROWS - 180) // 2)
        assert next(iterator, None) is None  # the old world's iteration ended
        with pytest.raises(ValueError, match="need 0 <= cur_shard < shard_count, got 2 of 2"):
            batches.on_world_change(2, 2)


def test_persistent_dataloader_workers_are_refused(converter):
    """Persistent workers keep the reader of the first iteration: no new position reaches them."""
    with pytest.raises(ValueError, match="persistent_workers=True: DataLoader's workers would"):
        with converter.make_torch_dataloader(**LOADER, num_workers=1, persistent_workers=True):
            pass


@pytest.mark.parametrize("drop_last", [False, True])
def test_any_sequence_of_worlds_reads_each_row_once(tmp_path, drop_last):
    """Random worlds of 1-5 ranks, each for a random number of steps, then the epoch's end:
    each row once (pads marked); with ``drop_last``, at most once, and only the tail of
    each split goes unread (fewer than its world's size). Files written with pyarrow."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparkdist.data.layout import describe
    from sparkdist.data.rank.reader import ShardReader

    rows = 0
    for index, groups in enumerate([[70, 30], [100], [25, 5, 45]]):
        table = pa.table({"id": np.arange(rows, rows + sum(groups))})
        with pq.ParquetWriter(tmp_path / f"part-{index}.parquet", table.schema) as writer:
            start = 0
            for size in groups:
                writer.write_table(table.slice(start, size), row_group_size=size)
                start += size
        rows += sum(groups)
    layout = describe(tmp_path.as_uri())
    options = {
        "batch_size": 7,
        "num_epochs": 1,
        "shuffle": True,
        "shuffle_buffer_rows": 60,
        "pad_column": "is_pad",
        "drop_last": drop_last,
        "prefetch": 0,
    }
    rng = np.random.default_rng(11)
    for _ in range(25):
        worlds = [int(w) for w in rng.integers(1, 6, size=int(rng.integers(2, 5)))]
        readers, commit, read, unread_at_most = [], None, [], 0
        for number, world in enumerate(worlds):
            for rank, shard in enumerate(readers[:world]):  # the survivors follow
                shard.on_world_change(rank, world)
            readers = readers[:world] + [
                ShardReader(layout, cur_shard=rank, shard_count=world, **options)
                for rank in range(len(readers), world)  # newcomers
            ]
            for shard in readers:
                if commit is not None:
                    shard.load_state_dict(commit)
            left = rows - (commit["rows_consumed"] if commit else 0)
            unread_at_most += left % world if drop_last else 0
            iterators = [iter(shard) for shard in readers]
            last = number == len(worlds) - 1
            for _ in range(10_000 if last else int(rng.integers(0, 6))):
                got = [next(iterator, None) for iterator in iterators]
                if got[0] is None:
                    assert all(batch is None for batch in got)  # equal steps
                    break
                read += [i for batch in got for i in batch["id"][~batch["is_pad"]].tolist()]
                commit = readers[0].state_dict()
                assert all(shard.state_dict() == commit for shard in readers)
        counts = Counter(int(i) for i in read)
        assert set(counts.values()) <= {1}, worlds
        if drop_last:
            assert rows - unread_at_most <= len(counts) <= rows, worlds
        else:
            assert sorted(counts) == list(range(rows)), worlds


def elastic_ranks(train, store: str) -> list[tuple[int, int, int, bool]]:
    """A rank of a 3 -> 2 -> 3 world in real processes, with gloo between its members.

    Launch rank 2 is lost after generation 0 and a newcomer (launch rank 2's process again,
    with a fresh loader) joins generation 2. Each generation, RANK / WORLD_SIZE are set
    and the world's state is broadcast from world rank 0, as `elastic.run` does; the
    survivors' loaders follow the environment. Returns (generation, step, id, is_pad) of
    the rows of committed steps.
    """
    import datetime

    import torch.distributed as dist

    launch = int(os.environ["RANK"])
    generations = [([0, 1, 2], 4), ([0, 1], 5), ([0, 1, 2], None)]  # members, steps
    read, commit = [], None
    with contextlib.ExitStack() as stack:
        loader = None
        for generation, (members, steps) in enumerate(generations):
            if launch not in members:
                stack.close()  # this rank is lost: its loader goes with it
                loader = None
                continue
            rank, world = members.index(launch), len(members)
            os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
            dist.init_process_group(
                "gloo",
                init_method=f"file://{store}/generation-{generation}",
                rank=rank,
                world_size=world,
                timeout=datetime.timedelta(seconds=120),
            )
            if loader is None:  # a newcomer: its loader's shard comes from the environment
                loader = stack.enter_context(train.make_torch_dataloader(**LOADER))
            if commit is not None:  # a restore: the step after the commit is redone
                loader.load_state_dict(commit)
            state = [loader.state_dict()]
            dist.broadcast_object_list(state, src=0)  # the state comes from a survivor
            loader.load_state_dict(state[0])
            step = 0
            for batch in loader:
                positions = [None] * world
                dist.all_gather_object(positions, loader.state_dict())  # a step's allreduce
                assert all(position == positions[0] for position in positions)
                commit = positions[0]
                pairs = zip(batch["id"].tolist(), batch["is_pad"].tolist(), strict=True)
                read += [(generation, step, i, pad) for i, pad in pairs]
                step += 1
                if step == steps:
                    break
            if generation == 0 and launch in generations[1][0]:
                next(iter(loader))  # a step that fails: it is not committed
            dist.destroy_process_group()
    return read


def test_rows_are_read_once_across_3_2_3_rank_processes(converter, tmp_path):
    results = HorovodRunner(np=-3, launcher="direct").run_all(
        elastic_ranks, train=converter, store=str(tmp_path)
    )
    rows = [row for result in results for row in result]
    kept = Counter(i for _, _, i, pad in rows if not pad)
    assert sorted(kept) == list(range(N_ROWS)) and set(kept.values()) == {1}
    for generation, members in enumerate([3, 2, 3]):  # equal steps in every world
        steps = [
            Counter(step for g, step, _, _ in result if g == generation)
            for result in results
            if any(g == generation for g, _, _, _ in result)
        ]
        assert len(steps) == members and all(count == steps[0] for count in steps)
