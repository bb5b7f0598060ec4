"""A loader's place in the world (which rank of how many): the environment's, or changed.

A rank reads its equal slice of each epoch (`sparkdist.data.rank.order`), so a loader must know
its place: ``(rank, world size)``, given (``cur_shard``, ``shard_count``) or read from the
environment (`rank_from_env`: torchrun's and the runner's names first, then Horovod's and
MPI's, as petastorm reads them). Under in-process elastic training
(`sparkdist.elastic.run`) the rank process and its loader live on through a change of the
world, and the place changes: a loader whose place came from the environment reads it again
when its next iteration starts (`moved`), and ``loader.on_world_change(rank, world_size)``
sets it directly. The position (what the world has read) stays; only its split changes.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

# Where a rank's place in the world is found: torchrun's and the runner's names first, then
# those petastorm checks (Horovod's, Open MPI's, MPICH's).
RANK_VARIABLES = (
    ("RANK", "WORLD_SIZE"),
    ("HOROVOD_RANK", "HOROVOD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
)


def rank_from_env() -> tuple[int, int, str] | None:
    """(rank, world size, the variable read) of this process, when its environment says."""
    for rank_name, size_name in RANK_VARIABLES:
        rank, size = os.environ.get(rank_name), os.environ.get(size_name)
        if rank is not None and size is not None:
            return int(rank), int(size), rank_name
    return None


def check_place(rank: int, world_size: int) -> tuple[int, int]:
    """``(rank, world_size)`` as ints, refused unless ``0 <= rank < world_size``."""
    rank, world_size = int(rank), int(world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= cur_shard < shard_count, got {rank} of {world_size}")
    return rank, world_size


def default_shard(cur_shard: int | None, shard_count: int | None) -> tuple[int, int, bool]:
    """(cur_shard, shard_count), by default this rank's (`rank_from_env`), else all the data,
    and whether that place is the environment's: a loader whose place is (the default
    shard, or the same one given) follows the environment (`moved`); one opened for an
    explicit other shard never moves with it.

    A shard given that is not the environment's rank is read as asked, with a warning (as
    petastorm warns): each rank usually reads its own.
    """
    found = rank_from_env()
    if cur_shard is None and shard_count is None:
        cur_shard, shard_count = found[:2] if found else (0, 1)
    elif found and (cur_shard, shard_count) != found[:2]:
        logger.warning(
            "sparkdist.data: reading cur_shard=%s, shard_count=%s as asked, but %s says this "
            "is rank %d of %d: give no shard (or cur_shard=rank, shard_count=world size) for "
            "each rank to read its own",
            cur_shard,
            shard_count,
            found[2],
            found[0],
            found[1],
        )
    if cur_shard is None or shard_count is None:
        raise ValueError("give both cur_shard and shard_count, or neither")
    place = check_place(cur_shard, shard_count)
    return place[0], place[1], found is not None and found[:2] == place


def moved(rank: int, world_size: int) -> tuple[int, int] | None:
    """The environment's ``(rank, world size)`` if it differs from a loader's, else None."""
    found = rank_from_env()
    if found is None or found[:2] == (rank, world_size):
        return None
    logger.info(
        "sparkdist.data: %s says rank %d of %d (the loader read as rank %d of %d): "
        "the loader follows the world",
        found[2],
        found[0],
        found[1],
        rank,
        world_size,
    )
    return check_place(found[0], found[1])
