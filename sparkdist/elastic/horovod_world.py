"""Forming a generation's Horovod world (`horovod.torch` on its Gloo controller) in process.

Horovod's Gloo controller reads its place (`HOROVOD_RANK`, `HOROVOD_SIZE`, the local and
cross layout) and its rendezvous server's address from the environment at each
`hvd.init()`, and `hvd.shutdown()` ends a world in the same process (what Horovod's own
elastic mode does between worlds). So for each generation:

* every member publishes its host name (`task-<NODE_RANK>`: ranks of one Spark task are
  one host, as the direct launcher names them) through the driver's KV store;
* world rank 0 starts a fresh Horovod rendezvous server (`backends.horovod`) for the
  generation's layout and publishes "host:port" under `sparkdist-elastic/<g>/horovod`, as
  `torch_group.form` does for its TCPStore (a new server per world: the old one's keys
  belong to the old world);
* every member sets the `HOROVOD_*` variables of its new place, ends the Horovod world it
  was in (`hvd.shutdown()`) and joins the new one (`hvd.init()`).

A peer's death fails the survivors' pending Horovod collective at once (its sockets
close; Horovod raises `HorovodInternalError`); a peer that hangs fails it after
`HOROVOD_GLOO_TIMEOUT_SECONDS`, which is set to the elastic timeout. Nothing can abort a
Gloo collective from outside, as with torch's gloo groups.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from sparkdist import job_environment
from sparkdist.backends import horovod as horovod_backend
from sparkdist.elastic import torch_group
from sparkdist.elastic.generations import Generation
from sparkdist.network import interface_of
from sparkdist.protocol.driver_channel import DriverClient

logger = logging.getLogger(__name__)


def host_key(generation: int, launch_rank: int) -> str:
    return f"sparkdist-elastic/{generation}/horovod-host/{launch_rank}"


def server_key(generation: int) -> str:
    return f"sparkdist-elastic/{generation}/horovod"


def is_collective_failure(exc: BaseException) -> bool:
    """Did a Horovod collective (or the forming of a world) fail because the world broke?
    Horovod raises `HorovodInternalError` for a collective whose Gloo peer is gone."""
    from horovod.common.exceptions import HorovodInternalError

    return isinstance(exc, HorovodInternalError) or torch_group.is_collective_failure(exc)


def layout(hostnames: list[str]) -> list[tuple[str, int, int]]:
    """(hostname, local_rank, local_size) of each world rank, from the hosts of the world's
    members in world-rank order: a host's ranks are numbered in world-rank order."""
    sizes = {name: hostnames.count(name) for name in hostnames}
    seen: dict[str, int] = {}
    places = []
    for name in hostnames:
        places.append((name, seen.get(name, 0), sizes[name]))
        seen[name] = seen.get(name, 0) + 1
    return places


def hook_gradients(optimizer: Any) -> None:
    """Give an `hvd.DistributedOptimizer` made in a world of one (a newcomer's first
    `hvd.init()`) the gradient hooks Horovod gives it only in a larger world, so that it
    averages gradients in the world just formed. (Horovod's own elastic mode registers them
    whatever the size, through `HOROVOD_ELASTIC=1`, which would also switch Horovod's Gloo
    controller to asking its elastic driver for every rank's place.)"""
    register = getattr(optimizer, "_register_hooks", None)
    if callable(register) and hasattr(optimizer, "_requires_update"):
        if not optimizer._requires_update and optimizer.process_set.included():
            register()


@dataclass
class HorovodWorld:
    """One generation's Horovod world, as this rank sees it (what `elastic.run` needs of a
    world: `generation`, `rank`, `world_size`, `abort`, `destroy`)."""

    generation: Generation
    rank: int
    _server: Any = field(default=None, repr=False)
    """World rank 0's rendezvous server: it lives as long as the world."""

    @property
    def world_size(self) -> int:
        return self.generation.size

    @property
    def device(self):
        """Where this world's collectives take tensors (Horovod takes CPU tensors with its
        Gloo operations)."""
        import torch

        return torch.device("cpu")

    def abort(self) -> None:
        """Nothing aborts a Gloo collective: a lost peer's closed sockets or the timeout end it."""

    def destroy(self) -> None:
        """End Horovod's world and stop the rendezvous server."""
        import horovod.torch as hvd

        if hvd.is_initialized():
            hvd.shutdown()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _serve_rendezvous(generation: Generation, client: DriverClient, host: str, join_s: float):
    """World rank 0's part: a rendezvous server for the members' layout, its address and
    the layout published under `server_key`. Returns the server."""
    hostnames = [client.get(host_key(generation.number, m), join_s) for m in generation.members]
    sock = horovod_backend.listening_socket(host)
    server = horovod_backend.start_rendezvous_server(
        sock, horovod_backend.host_alloc_plan(layout(hostnames))
    )
    client.put(server_key(generation.number), [host, sock.getsockname()[1], hostnames])
    return server


def _place_env(slot: horovod_backend.Slot, addr: str, port: int, limit_s: float) -> dict:
    """`backends.horovod.gloo_env` for `slot`, with Gloo's timeout set to the elastic one,
    and `RANK` and `WORLD_SIZE` for code that reads those."""
    return {
        **horovod_backend.gloo_env(slot, addr, port),
        "HOROVOD_GLOO_TIMEOUT_SECONDS": str(max(1, round(limit_s))),
        "RANK": str(slot.rank),
        "WORLD_SIZE": str(slot.size),
    }


def form(
    generation: Generation, launch_rank: int, client: DriverClient, limit_s: float
) -> HorovodWorld:
    """Form `generation`'s Horovod world: `hvd.init()` with this rank's place in it (after
    `hvd.shutdown()` if Horovod was initialised); sets `RANK` and `WORLD_SIZE` too."""
    import horovod.torch as hvd

    rank = generation.world_rank(launch_rank)
    if rank is None:
        raise ValueError(
            f"launch rank {launch_rank} is not a member of generation {generation.number}"
        )
    join_s = torch_group.JOIN_FACTOR * limit_s
    host = os.environ.get(job_environment.TASK_HOST, "127.0.0.1")
    hostname = f"task-{os.environ.get(job_environment.NODE_RANK, '0')}"
    client.put(host_key(generation.number, launch_rank), hostname)
    server = None
    if rank == 0:
        server = _serve_rendezvous(generation, client, host, join_s)
    addr, port, hostnames = client.get(server_key(generation.number), join_s)
    slot = horovod_backend.host_alloc_plan(layout(hostnames))[rank]
    os.environ.update(_place_env(slot, addr, port, limit_s))
    if "HOROVOD_GLOO_IFACE" not in os.environ:
        try:
            os.environ["HOROVOD_GLOO_IFACE"] = interface_of(host)[0]
        except ValueError:
            pass  # Gloo picks the interface of the host's name
    if hvd.is_initialized():
        hvd.shutdown()
    try:
        hvd.init()
    except BaseException:
        if server is not None:
            server.shutdown()
            server.server_close()
        raise
    logger.info(
        "elastic: generation %d formed: Horovod rank %d of %d",
        generation.number,
        hvd.rank(),
        hvd.size(),
    )
    return HorovodWorld(generation, rank, server)
