"""`torch.distributed.rpc` on the runner's ranks, started and stopped safely.

    from sparkdist import torch_rpc

    with torch_rpc.rpc_session() as name:  # "worker0", "worker1", ...
        ...  # rpc.rpc_sync(torch_rpc.worker_name(0), ...), RemoteModule, RRefs

Every rank takes its rank, world size and rendezvous (`env://`: the MASTER_ADDR and
MASTER_PORT the torch backend set) from its environment; user code parses nothing.

Two races of plain `rpc.init_rpc`/`rpc.shutdown` are closed here:

* `RemoteModule` writes `_remote_module_non_scriptable` when a process first imports
  `torch.distributed.nn`; an RPC that reaches a rank before that import fails with
  ModuleNotFoundError. `init_rpc` imports it before joining.
* Rank 0 hosts the TCPStore that RPC's graceful shutdown uses as a barrier. In
  `TensorPipeAgent::join` the last `syncCallCount` waits for a ready key and then reads
  a counter (`store.get`): rank 0 can pass both and exit while another rank sits between
  the two, which then fails with "Connection reset by peer". `shutdown` therefore has
  every rank mark in that store that its `rpc.shutdown()` returned, and rank 0 waits for
  every mark before it returns. The store is still served at that point: `rpc.init_rpc`
  keeps the rendezvous generator that owns it in the module global
  `torch.distributed.rpc.rendezvous_iterator`, which shutdown never clears.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_RPC_TIMEOUT = 120.0
"""Seconds an RPC (and the rendezvous) may take; torch's own default is 60."""
DEFAULT_NUM_WORKER_THREADS = 16
"""TensorPipe's thread pool for incoming RPCs (torch's default)."""
DEFAULT_LEAVE_TIMEOUT = 120.0
"""Seconds rank 0 waits, after its own shutdown, for the other ranks to leave theirs."""
LEFT_KEY = "sparkdist/rpc/{session}/left/{rank}"


@dataclass
class _Session:
    """What `shutdown` needs of the `init_rpc` that started the current session."""

    number: int
    rank: int
    world_size: int
    store: Any  # a torch.distributed.TCPStore client of rank 0's store


_session: _Session | None = None
_sessions_started = 0


def worker_name(rank: int) -> str:
    """The RPC name `init_rpc` gives `rank` by default."""
    return f"worker{rank}"


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise RuntimeError(
            f"{name} is not set: run this on a rank started by sparkdist (HorovodRunner, "
            "TorchDistributor) or torchrun"
        )
    return int(value)


def _master() -> tuple[str, int]:
    """Rank 0's store address, as the torch backend set it."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        raise RuntimeError(
            "MASTER_ADDR and MASTER_PORT are not set: run this on a rank started by "
            "sparkdist (HorovodRunner, TorchDistributor) or torchrun"
        )
    return addr, int(port)


def rpc_options(
    *,
    rpc_timeout: float = DEFAULT_RPC_TIMEOUT,
    num_worker_threads: int = DEFAULT_NUM_WORKER_THREADS,
) -> Any:
    """TensorPipe options that rendezvous at MASTER_ADDR:MASTER_PORT (`env://`), the
    store a Gloo process group started with `init_process_group("gloo")` also uses."""
    from torch.distributed import rpc

    _master()  # fail here, with advice, rather than deep in the rendezvous
    return rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=num_worker_threads, rpc_timeout=rpc_timeout, init_method="env://"
    )


def init_rpc(
    name: str | None = None,
    *,
    rpc_timeout: float = DEFAULT_RPC_TIMEOUT,
    num_worker_threads: int = DEFAULT_NUM_WORKER_THREADS,
) -> str:
    """Join this rank to the job's RPC group and return its RPC name (by default
    `worker{RANK}`). Works with or without a default process group: both share rank
    0's store. Pair it with `shutdown()` (or use `rpc_session`)."""
    global _session, _sessions_started
    import torch.distributed as dist
    import torch.distributed.nn  # noqa: F401 - RemoteModule's generated module, first
    from torch.distributed import rpc

    if _session is not None:
        raise RuntimeError("torch_rpc.init_rpc was called twice without shutdown()")
    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    name = name or worker_name(rank)
    options = rpc_options(rpc_timeout=rpc_timeout, num_worker_threads=num_worker_threads)
    addr, port = _master()
    logger.info(
        "Rank %d joins RPC as %r (world size %d, store %s:%d)", rank, name, world_size, addr, port
    )
    rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=options)
    # A client of the store RPC just rendezvoused at (rank 0 serves it): shutdown's
    # "left" marks go there. Made now, while every rank is known to be up.
    store = dist.TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=rpc_timeout))
    _sessions_started += 1
    _session = _Session(_sessions_started, rank, world_size, store)
    return name


def shutdown(*, leave_timeout: float = DEFAULT_LEAVE_TIMEOUT) -> None:
    """Leave RPC gracefully (wait for every rank's outstanding work), then keep rank 0,
    the store's host, alive until every rank has left: see the module's docstring."""
    global _session
    from torch.distributed import rpc

    session = _session
    if session is None:
        raise RuntimeError("torch_rpc.shutdown() without torch_rpc.init_rpc()")
    _session = None
    store = session.store
    left_key = LEFT_KEY.format(session=session.number, rank=session.rank)
    try:
        rpc.shutdown(graceful=True)
    except BaseException:
        # Rank 0 should not wait for this rank in vain; the shutdown's error comes first.
        with contextlib.suppress(Exception):
            store.set(left_key, b"1")
        raise
    store.set(left_key, b"1")
    if session.rank != 0:
        return
    keys = [LEFT_KEY.format(session=session.number, rank=r) for r in range(1, session.world_size)]
    try:
        store.wait(keys, timedelta(seconds=leave_timeout))
    except Exception as exc:  # noqa: BLE001 - torch raises DistStoreError or RuntimeError
        missing = [k for k in keys if not store.check([k])]
        logger.warning(
            "RPC shutdown: ranks still in rpc.shutdown() after %.0fs (%s): %s",
            leave_timeout,
            ", ".join(k.rsplit("/", 1)[1] for k in missing) or "none",
            exc,
        )
        return
    logger.info("RPC shutdown: all %d ranks have left", session.world_size)


@contextlib.contextmanager
def rpc_session(
    name: str | None = None,
    *,
    rpc_timeout: float = DEFAULT_RPC_TIMEOUT,
    num_worker_threads: int = DEFAULT_NUM_WORKER_THREADS,
    leave_timeout: float = DEFAULT_LEAVE_TIMEOUT,
) -> Iterator[str]:
    """`init_rpc`, the body, `shutdown`. If the body raises, RPC is shut down at once
    (not gracefully: the other ranks may never reach theirs) and the error propagates."""
    global _session
    from torch.distributed import rpc

    joined = init_rpc(name, rpc_timeout=rpc_timeout, num_worker_threads=num_worker_threads)
    try:
        yield joined
    except BaseException:
        _session = None
        try:
            rpc.shutdown(graceful=False)
        except Exception:  # noqa: BLE001 - the body's error is the one to report
            logger.warning("RPC shutdown after an error failed too", exc_info=True)
        raise
    shutdown(leave_timeout=leave_timeout)
