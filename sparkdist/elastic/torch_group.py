"""Forming and ending a generation's torch process group, so that no rank waits forever.

World rank 0 of generation g starts a fresh `TCPStore` on its task's host (port 0: the
system picks one) and publishes "host:port" through the driver's KV store under
`sparkdist-elastic/<g>/store`; the others read it and meet there. Every step has a timeout
(`SPARKDIST_ELASTIC_TIMEOUT_S`, default 30 s): every collective (gloo and NCCL both honour
`init_process_group(timeout=...)`), and twice that for the members of a new world to meet
(one may still be waiting in the old world's collective).

What unblocks a rank whose peer is lost:
* gloo: a peer's death closes its sockets, and the survivors' pending collective fails at
  once ("Connection reset by peer"); a peer that hangs, or a host that vanishes without
  closing its connections, fails the collective after the timeout. (Aborting a gloo group
  from another thread does not interrupt a pending collective.)
* NCCL: nothing returns by itself. The watcher aborts the communicators
  (`_abort_process_group`) as soon as the driver formed a world without the lost peer, and
  the collective timeout with `TORCH_NCCL_ASYNC_ERROR_HANDLING` covers the rest.
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from sparkdist import job_environment
from sparkdist.elastic.generations import Generation, Generations, WorldChanged
from sparkdist.protocol.driver_channel import DriverClient

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0
JOIN_POLL_S = 0.5
"""While the members of a new world meet: how often a member asks the driver whether a
newer world formed (a member lost as this one formed: the wait is for nothing)."""
JOIN_FACTOR = 2
"""Members of a new world wait this many timeouts for each other: one may still be in the
old world's collective for up to a timeout before it notices the change."""
TRANSPORT_ERRORS = (
    "gloo",
    "nccl",
    "connection reset",
    "connection closed",
    "broken pipe",
    "timed out",
    "process group",
    "communicator",
    "socket",
)
"""Words of a RuntimeError that a collective raised because its group broke."""
_old_groups: list = []
"""The process groups (torch's Python objects) of worlds that ended, until `free_old_groups`
may drop them."""


def timeout_s(env=os.environ) -> float:
    """The elastic timeout (seconds) from `SPARKDIST_ELASTIC_TIMEOUT_S`, checked early."""
    text = env.get(job_environment.ELASTIC_TIMEOUT_S, "")
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ValueError(
            f"{job_environment.ELASTIC_TIMEOUT_S} must be a positive number of "
            f"seconds, not {text!r}"
        )
    return value


def store_key(generation: int) -> str:
    return f"sparkdist-elastic/{generation}/store"


def backend_for_rank(env=os.environ) -> str:
    """`SPARKDIST_ELASTIC_BACKEND` if set (checked early), else NCCL when this rank has a
    GPU, else gloo."""
    import torch

    chosen = env.get(job_environment.ELASTIC_BACKEND, "")
    if chosen:
        if chosen not in ("nccl", "gloo"):
            name = job_environment.ELASTIC_BACKEND
            raise ValueError(f'{name} must be "nccl" or "gloo", not {chosen!r}')
        return chosen
    return "nccl" if torch.cuda.is_available() and torch.distributed.is_nccl_available() else "gloo"


def is_collective_failure(exc: BaseException) -> bool:
    """Did a collective fail because the group broke (not because of the user's code)?"""
    import torch.distributed as dist

    if isinstance(exc, (dist.DistError, TimeoutError)):  # backend, store, network; forming
        return True
    if isinstance(exc, RuntimeError):
        text = str(exc).lower()
        return any(word in text for word in TRANSPORT_ERRORS)
    return False


@dataclass
class TorchGroup:
    """The default torch process group of one generation, as this rank sees it."""

    generation: Generation
    rank: int
    backend: str
    _store: Any = field(default=None, repr=False)
    """World rank 0's `TCPStore` server: it lives as long as the group."""

    @property
    def world_size(self) -> int:
        return self.generation.size

    @property
    def device(self):
        """Where this group's collectives take tensors."""
        import torch

        return (
            torch.device("cuda", torch.cuda.current_device())
            if self.backend == "nccl"
            else torch.device("cpu")
        )

    def abort(self) -> None:
        """Abort NCCL communicators so that a pending collective returns (safe from another
        thread); gloo's cannot be interrupted and end by their timeout."""
        import torch.distributed as dist

        if self.backend == "nccl" and dist.is_initialized():
            try:
                dist.distributed_c10d._abort_process_group()
            except (RuntimeError, ValueError) as exc:  # already aborted or destroyed
                logger.debug("elastic: abort: %s", exc)

    def destroy(self) -> None:
        """End the group (NCCL's aborted first, so nothing blocks) and its store."""
        import torch.distributed as dist

        self.abort()
        if dist.is_initialized():
            _old_groups.extend(dist.distributed_c10d._world.pg_map)  # see free_old_groups
            try:
                dist.destroy_process_group()
            except (RuntimeError, ValueError) as exc:
                logger.debug("elastic: destroy: %s", exc)
        self._store = None


_left_formed: TorchGroup | None = None
"""The group a finished `elastic.run` left formed (user code may still use it after the
call): torch holds one default process group a process, so the next call ends it first."""


def leave_formed(group: TorchGroup) -> None:
    """``group`` stays formed after its `elastic.run` returned."""
    global _left_formed
    _left_formed = group


def end_left_formed() -> None:
    """End the group an earlier `elastic.run` left formed, if any."""
    global _left_formed
    if _left_formed is not None:
        _left_formed.destroy()
        _left_formed = None
        free_old_groups()


def free_old_groups() -> None:
    """Free the ended worlds' process groups that nothing else holds any more.

    A gloo group's destructor joins its worker threads, and a worker that is still letting
    go of its last collective needs the GIL for that (the collective keeps the Python
    objects of the thread that started it: DDP's are started in backward). So the last
    reference must go where the GIL is released: torch's Python object of the group
    releases it while freeing the group, DDP's C++ reducer does not, and one freed with the
    GIL held would wait for the worker forever. `destroy` keeps each group's Python object
    here; the caller frees the world's objects (its DDP) first, then this drops the groups
    that only this list still holds (their sockets close, so a peer still in one of their
    collectives fails at once). One that something else holds (a DDP kept beyond its
    world) stays until a later call finds it free."""
    global _old_groups
    # A group's references here: the list's, the loop's and getrefcount's argument.
    _old_groups = [group for group in _old_groups if sys.getrefcount(group) > 3]


def form(
    generation: Generation, launch_rank: int, client: DriverClient, limit_s: float
) -> TorchGroup:
    """Form `generation`'s default process group; sets `RANK`, `WORLD_SIZE`, `MASTER_ADDR`
    and `MASTER_PORT` for code that reads them. Members wait `JOIN_FACTOR * limit_s` for
    each other, then collectives time out after `limit_s`."""
    import torch._dynamo  # noqa: F401 - before any group: see below
    import torch.distributed as dist

    # torch._dynamo (DDP imports it) keeps references to the default group of the moment
    # it is first imported: imported inside a world, that world's group is never freed.
    rank = generation.world_rank(launch_rank)
    if rank is None:
        raise ValueError(
            f"launch rank {launch_rank} is not a member of generation {generation.number}"
        )
    backend, size = backend_for_rank(), generation.size
    join = datetime.timedelta(seconds=JOIN_FACTOR * limit_s)
    generations, server = Generations(client, launch_rank), None
    if rank == 0:
        host = os.environ.get(job_environment.TASK_HOST) or os.environ.get(
            "MASTER_ADDR", "127.0.0.1"
        )
        server = dist.TCPStore(host, 0, size, is_master=True, wait_for_workers=False, timeout=join)
        port = str(server.port)
        client.put(store_key(generation.number), f"{host}:{port}")
        store = server
    else:
        host, port = _store_address(client, generation, generations, join.total_seconds())
        store = dist.TCPStore(host, int(port), size, is_master=False, timeout=join)
    store.set(f"joined/{rank}", "1")  # a member still leaving the old world may come late
    _wait_joined(store, generation, generations, join.total_seconds())
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(size), MASTER_ADDR=host, MASTER_PORT=port)
    if backend == "nccl":  # abort the communicator on an error, keep the process (not 3)
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    timeout = datetime.timedelta(seconds=limit_s)
    if not dist.is_initialized():
        # The default group's keys in the store start with torch's count of the groups
        # this process named, which only destroying a group resets: a member whose last
        # init_process_group failed (a peer lost as that world formed) would be one ahead
        # of a newcomer, and the two would wait on different keys, world after world.
        dist.distributed_c10d._world.group_count = 0
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=timeout)
    logger.info(
        "elastic: generation %d formed: rank %d of %d (%s)", generation.number, rank, size, backend
    )
    return TorchGroup(generation, rank, backend, server)


def _store_address(
    client: DriverClient, generation: Generation, generations: Generations, join_s: float
) -> list[str]:
    """Rank 0's store of `generation` ([host, port]), waited for up to `join_s` a
    `JOIN_POLL_S` at a time. A newer world formed meanwhile (rank 0 was lost as this one
    formed, so it never publishes one) ends the wait at once, as in `_wait_joined`: one
    read of the whole `join_s` kept the other members waiting that long for a world that
    was over."""
    key = store_key(generation.number)
    deadline = time.monotonic() + join_s
    while True:
        left = deadline - time.monotonic()
        try:
            return client.get(key, max(0.001, min(left, JOIN_POLL_S))).rsplit(":", 1)
        except TimeoutError:
            if time.monotonic() >= deadline:
                late = f"rendezvous value {key!r} did not arrive within {join_s}s"
                raise TimeoutError(late) from None
        newer = generations.newer(generation.number, 0.0)
        if newer is not None:
            raise WorldChanged(f"generation {newer.number} formed as {generation.number} formed")


def _wait_joined(store, generation: Generation, generations: Generations, join_s: float) -> None:
    """Wait up to `join_s` for every member of `generation` to join its store. A newer
    world formed meanwhile (a member was lost as this one formed: the driver formed one
    without it, or, below min_np, with newcomers) ends the wait at once: `WorldChanged`,
    and `elastic.run` joins the newer one (the state is as committed: nothing to undo)."""
    keys = [f"joined/{r}" for r in range(generation.size)]
    deadline = time.monotonic() + join_s
    while not store.check(keys) and time.monotonic() < deadline:
        newer = generations.newer(generation.number, 0.0)
        if newer is not None:
            raise WorldChanged(f"generation {newer.number} formed as {generation.number} formed")
        time.sleep(JOIN_POLL_S)
    left = max(0.001, deadline - time.monotonic())
    store.wait(keys, datetime.timedelta(seconds=left))  # the store's own error if still short
