"""A warm world's torch process group, kept from one run to the next (issue 61).

Forming a process group costs a rendezvous and, on NCCL, a communicator (0.2-0.8 s on
one node); a warm world forms it once. In a warm rank, `install` wraps torch's
`init_process_group` and `destroy_process_group` as soon as `torch.distributed` is
imported:

* The first plain `init_process_group(backend)` (env://, no store or group name of its
  own) forms the group on the world's store: a `TCPStore` that rank 0 hosts, published
  through the driver only once it listens, so no rank connects too early and backs off.
  NCCL is set up eagerly on the current device (`device_id`).
* A later plain call for the same backend, rank, size and device finds it and returns.
* `destroy_process_group()` of the kept group leaves it up: the world ends it.
* Any other call (a store or `init_method` of its own, as `sparkdist.elastic` makes)
  ends the kept group and the world's store, and goes to torch as it is.

`begin_run` starts each run: the ranks agree through the store whether every one still
holds the group (a run may have aborted it), and if so a barrier on it lets whatever an
earlier run left queued finish; if not, every rank drops it and the next
`init_process_group` forms a new one. `end_run` ends what a run made beside it.
"""

from __future__ import annotations

import datetime
import functools
import inspect
import logging
import os
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from sparkdist import job_environment
from sparkdist.backends.import_hooks import after_import
from sparkdist.errors import SparkdistError

logger = logging.getLogger(__name__)

STORE_KEY = "torch/warm-store"
"""The rendezvous key (under the run's own prefix) of the world's store address."""
AGREE_TIMEOUT = datetime.timedelta(seconds=120)
"""How long the ranks of a run wait for each other at its start (they start together)."""
BARRIER_TIMEOUT = datetime.timedelta(seconds=120)
"""How long the start-of-run barrier on the kept group may take (less if the group's own
timeout is less) before the world is given up: an earlier run left a collective queued
that no peer will match."""


@dataclass
class _Store:
    """The world's `TCPStore` as this rank holds it (rank 0: the server)."""

    store: Any
    address: tuple[str, int]
    rank: int
    world_size: int


@dataclass
class _Kept:
    group: Any
    key: tuple[str | None, int, int, str]
    """(backend, rank, world size, device) it was formed for."""
    barrier_timeout: datetime.timedelta
    """The group's own timeout, at most BARRIER_TIMEOUT."""


_client: Any = None
_host: str = "127.0.0.1"
_store: _Store | None = None
_kept: _Kept | None = None
_formed_in_run = 0
_original: dict[str, Any] = {}


def install(client: Any, host: str) -> None:
    """Called once by a warm rank: keep torch's default group from run to run. `host` is
    the address of this rank's task, which every rank can reach."""
    global _client, _host
    _client, _host = client, host
    after_import("torch.distributed", _wrap)


def _wrap(module: ModuleType) -> None:
    if _original or not hasattr(module, "init_process_group"):
        return
    _original["init"] = module.init_process_group
    _original["destroy"] = module.destroy_process_group
    module.init_process_group = functools.wraps(_original["init"])(init_process_group)
    module.destroy_process_group = functools.wraps(_original["destroy"])(destroy_process_group)


def init_process_group(
    backend: str | None = None,
    init_method: str | None = None,
    timeout: datetime.timedelta | None = None,
    world_size: int = -1,
    rank: int = -1,
    store: Any = None,
    group_name: str = "",
    pg_options: Any = None,
    device_id: Any = None,
    **rest: Any,
) -> None:
    """torch's `init_process_group` in a warm rank: a plain call keeps (or finds) the
    world's group; any other ends it and goes to torch."""
    import torch.distributed as dist

    args = (backend, init_method, timeout, world_size, rank, store, group_name, pg_options)
    if device_id is not None:
        rest["device_id"] = device_id  # a keyword: torch before 2.3 has no such parameter
    plain = store is None and init_method in (None, "env://") and not group_name
    if not plain or pg_options is not None or set(rest) - {"device_id"}:
        forget()
        return _original["init"](*args, **rest)
    rank = rank if rank >= 0 else int(os.environ["RANK"])
    world_size = world_size if world_size > 0 else int(os.environ["WORLD_SIZE"])
    device_id = _device_for(backend, device_id)
    key = (backend, rank, world_size, str(device_id))
    if _kept is not None and _kept.key == key and _is_default(_kept.group):
        logger.debug("warm world: the kept %s process group serves this run", backend)
        return None
    drop()
    if dist.is_initialized():  # the run's own group, not ours: torch says it is formed
        return _original["init"](*args, **rest)
    _form(backend, rank, world_size, timeout, device_id, key)
    return None


def destroy_process_group(group: Any = None) -> None:
    """torch's `destroy_process_group`, except that the kept group stays up."""
    import torch.distributed as dist

    if _kept is not None and _is_default(_kept.group) and group in (None, dist.group.WORLD):
        return
    _original["destroy"](group)


def _is_default(group: Any) -> bool:
    import torch.distributed as dist

    return dist.distributed_c10d.GroupMember.WORLD is group


def _device_for(backend: str | None, device_id: Any) -> Any:
    """NCCL's device, so that its communicator is built at once and bound to it (where
    torch's `init_process_group` takes a `device_id`: 2.3 and later)."""
    if device_id is not None or backend is None or "nccl" not in str(backend).lower():
        return device_id
    if "device_id" not in inspect.signature(_original["init"]).parameters:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.device("cuda", torch.cuda.current_device())


def _form(backend, rank: int, world_size: int, timeout, device_id, key: tuple) -> None:
    global _kept, _formed_in_run
    import torch.distributed as dist

    _formed_in_run += 1
    store = _world_store(rank, world_size)
    prefix = f"{os.environ.get(job_environment.JOB_ID, 'run')}/{_formed_in_run}/"
    device = {"device_id": device_id} if device_id is not None else {}
    _original["init"](
        backend,
        store=dist.PrefixStore(prefix, store.store),
        rank=rank,
        world_size=world_size,
        timeout=timeout,
        **device,
    )
    wait = min(timeout, BARRIER_TIMEOUT) if timeout is not None else BARRIER_TIMEOUT
    _kept = _Kept(dist.distributed_c10d.GroupMember.WORLD, key, wait)
    logger.info("warm world: %s process group formed, kept for the next runs", backend)


def _world_store(rank: int, world_size: int) -> _Store:
    """The world's store: made once by rank 0, listening before its address is known."""
    global _store
    import torch.distributed as dist

    if _store is not None and (_store.rank, _store.world_size) != (rank, world_size):
        _store = None  # another world (an elastic one changed): its own store
    key = f"{STORE_KEY}/{_formed_in_run}"
    if rank == 0:
        if _store is None:
            server = dist.TCPStore(
                _host, 0, None, is_master=True, wait_for_workers=False, timeout=AGREE_TIMEOUT
            )
            _store = _Store(server, (_host, server.port), rank, world_size)
        _client.put(key, _store.address)
        return _store
    address = tuple(_client.get(key, AGREE_TIMEOUT.total_seconds()))
    if _store is None or _store.address != address:
        host, port = address
        client = dist.TCPStore(host, port, None, is_master=False, timeout=AGREE_TIMEOUT)
        _store = _Store(client, (host, port), rank, world_size)
    return _store


def drop() -> None:
    """End the kept group, if it is still torch's default (NCCL's aborted first, so that
    nothing blocks on a peer)."""
    global _kept
    kept, _kept = _kept, None
    if kept is None or not _is_default(kept.group):
        return
    import torch.distributed as dist

    if kept.key[0] is not None and "nccl" in str(kept.key[0]).lower():
        try:
            dist.distributed_c10d._abort_process_group()
        except (RuntimeError, ValueError) as exc:
            logger.debug("warm world: abort: %s", exc)
    if dist.is_initialized():
        _original["destroy"]()


def forget() -> None:
    """The run forms its own groups (an elastic world does): end ours and its store."""
    global _store
    drop()
    _store = None


def begin_run() -> None:
    """Each run's start: keep the group only if every rank still holds it, and let what
    an earlier run left queued on it finish."""
    global _formed_in_run, _kept
    _formed_in_run = 0
    if _store is None:
        return
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if (rank, size) != (_store.rank, _store.world_size):
        forget()  # the world changed (in-process elastic): every member sees it changed
        return
    intact = _kept is not None and _is_default(_kept.group)
    if not _all_agree(intact, size):
        logger.info("warm world: a rank lost the kept process group; a new one is formed")
        drop()
        return
    if _kept is None:
        return
    import torch.distributed as dist

    wait = _kept.barrier_timeout
    try:
        dist.barrier(async_op=True).wait(wait)
    except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError or its own
        _kept = None  # not destroyed: a gloo group waits for its stuck worker; the rank ends
        raise SparkdistError(
            "the warm world's process group, kept from the last run, did not pass a barrier "
            f"within {wait.total_seconds():.0f} s (a collective of an earlier run left "
            f"unmatched?): {exc}; the world is released, the next run starts anew"
        ) from exc


def _all_agree(intact: bool, size: int) -> bool:
    """Whether every rank still holds the kept group: counted on the world's store."""
    store = _store.store
    job = os.environ.get(job_environment.JOB_ID, "run")
    store.add(f"{job}/intact", 1 if intact else 0)
    if store.add(f"{job}/arrived", 1) == size:
        store.set(f"{job}/all", "1")
    store.wait([f"{job}/all"], AGREE_TIMEOUT)
    return store.add(f"{job}/intact", 0) == size


def end_run() -> None:
    """Each run's end: the kept group stays; a group the run formed itself, and the
    subgroups it made, are ended (the next run's `init_process_group` would fail)."""
    if "torch.distributed" not in sys.modules:
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    destroy = _original.get("destroy", dist.destroy_process_group)
    if _kept is None or not _is_default(_kept.group):
        destroy()
        return
    for group in list(dist.distributed_c10d._world.pg_map):
        if group is not _kept.group:
            destroy(group)
