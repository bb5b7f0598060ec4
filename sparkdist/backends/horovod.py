"""Horovod: unmodified `horovod.torch` code under either launcher.

Under the mpi launcher there is nothing to do: Horovod (built with MPI) is started by
mpirun like under `horovodrun --mpi`, reads Open MPI's environment and uses its MPI
controller. Nothing is set that could change that choice.

Under the direct launcher there is no MPI, so Horovod must use its Gloo controller,
which finds its peers through an HTTP key-value store (what `horovodrun --gloo` starts
on its host). Here rank 0 hosts Horovod's own `RendezvousHTTPServer`, listening on its
task's address only, and every rank gets the variables `horovodrun --gloo` would give
it (HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT, HOROVOD_CONTROLLER=gloo,
HOROVOD_CPU_OPERATIONS=gloo, HOROVOD_GLOO_IFACE, HOROVOD_HOSTNAME and the rank layout).
The layout is Horovod's own (`get_host_assignments`): ranks are grouped by Spark task,
and cross ranks count the tasks that have a rank at the same local rank.

Cost: all of this runs only when Horovod is installed in the rank's environment, and
then costs a few driver round trips and one listening socket. Rank 0 imports Horovod's
server module (30-40 ms) and starts the server only when its own code imports Horovod,
which it must do before any rank's `hvd.init()` can complete; the socket listens from
the start, so connections that come first wait in its backlog.

In every rank, `import horovod.tensorflow` (or `horovod.keras`) with TensorFlow >= 2.16
fails with an error that says why and what to use instead, rather than Horovod's own
"extension has not been built ... reinstall Horovod" (rebuilding cannot help: Horovod's
last release predates TensorFlow 2.16 and Keras 3).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import socket
import sys
import threading
from dataclasses import dataclass

from sparkdist.backends.base import RankContext
from sparkdist.backends.import_hooks import after_import, refusing_spec
from sparkdist.network import interface_of

logger = logging.getLogger(__name__)

# Horovod's TensorFlow-based modules (submodules are covered through their parents).
TENSORFLOW_MODULES = ("horovod.tensorflow", "horovod.keras", "horovod._keras")
FIRST_UNSUPPORTED_TF = (2, 16)
_TF_DISTRIBUTIONS = (
    "tensorflow",
    "tensorflow-cpu",
    "tensorflow-gpu",
    "tensorflow-intel",
    "tensorflow-macos",
    "tensorflow-aarch64",
    "tf-nightly",
    "tf-nightly-cpu",
)


# --- horovod.tensorflow with TensorFlow >= 2.16 -------------------------------------------


def installed_tensorflow_version() -> str | None:
    """The installed TensorFlow's version, without importing it (None if absent)."""
    module = sys.modules.get("tensorflow")
    if module is not None and getattr(module, "__version__", None):
        return module.__version__
    from importlib import metadata

    for dist in _TF_DISTRIBUTIONS:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _version_tuple(version: str) -> tuple[int, int]:
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit()) or "0"
        parts.append(int(digits))
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


def horovod_tensorflow_message(tf_version: str) -> str:
    return (
        f"Horovod's TensorFlow binding (horovod.tensorflow, horovod.keras) cannot work with "
        f"the installed TensorFlow {tf_version}: TensorFlow 2.16 and later (with Keras 3) "
        "are not supported by Horovod, whose last release (0.28.1) predates them, and "
        "rebuilding Horovod does not help. Train TensorFlow models with "
        "tf.distribute.MultiWorkerMirroredStrategy under the same runner instead: "
        "HorovodRunner(np=N).run(main) gives every rank a TF_CONFIG, and in main: "
        "strategy = tf.distribute.MultiWorkerMirroredStrategy(); with strategy.scope(): "
        "build and compile the model; then model.fit(...). (horovod.torch is unaffected.)"
    )


class HorovodTensorFlowFinder(importlib.abc.MetaPathFinder):
    """Stops `import horovod.tensorflow` with a clear message when TensorFlow >= 2.16.

    It only compares module names until one of Horovod's TensorFlow modules is
    imported, so it costs nothing to other imports.
    """

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in TENSORFLOW_MODULES:
            return None
        version = installed_tensorflow_version()
        if version is None or _version_tuple(version) < FIRST_UNSUPPORTED_TF:
            return None  # Horovod's own import decides
        return refusing_spec(fullname, horovod_tensorflow_message(version))


def install_tensorflow_guard() -> None:
    if not any(isinstance(f, HorovodTensorFlowFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, HorovodTensorFlowFinder())


# --- Gloo rendezvous for the direct launcher ----------------------------------------------


@dataclass(frozen=True)
class Slot:
    """One rank's place, as Horovod's `SlotInfo` (the fields its server reads)."""

    hostname: str
    rank: int
    local_rank: int
    cross_rank: int
    size: int
    local_size: int
    cross_size: int


def host_alloc_plan(hosts: list[tuple[str, int, int]]) -> list[Slot]:
    """Every rank's slot from (hostname, local_rank, local_size) in rank order, as
    Horovod's `get_host_assignments` computes it: the cross communicator of local rank
    k holds one rank per host that has a local rank k, in host order."""
    order: list[str] = []
    for hostname, _, _ in hosts:
        if hostname not in order:
            order.append(hostname)
    local_sizes = {hostname: local_size for hostname, _, local_size in hosts}
    plan = []
    for rank, (hostname, local_rank, local_size) in enumerate(hosts):
        peers = [h for h in order if local_sizes[h] > local_rank]
        plan.append(
            Slot(
                hostname=hostname,
                rank=rank,
                local_rank=local_rank,
                cross_rank=peers.index(hostname),
                size=len(hosts),
                local_size=local_size,
                cross_size=len(peers),
            )
        )
    return plan


# Rank 0's rendezvous server, kept for the life of the process.
_servers: list = []


def gloo_env(slot: Slot, addr: str, port: int) -> dict[str, str]:
    """The variables Horovod's Gloo controller reads at `hvd.init()` for `slot`, with its
    rendezvous server at `addr:port` (as `horovodrun --gloo` sets them)."""
    return {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_HOSTNAME": slot.hostname,
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
    }


def listening_socket(host: str) -> socket.socket:
    """A socket listening on a free port of `host`: the rendezvous server's, taken now so
    that its address can be published before the server exists."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(128)
    return sock


def start_rendezvous_server(sock: socket.socket, plan: list[Slot]):
    """Horovod's rendezvous HTTP server on `sock`, serving from a daemon thread until its
    `shutdown()`. Connections that arrived before it started are in the listen backlog and
    are served then."""
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    class Server(RendezvousHTTPServer):
        def server_bind(self):  # adopt `sock` instead of binding a new socket
            self.socket.close()
            self.socket = sock
            self.server_address = sock.getsockname()
            self.server_name, self.server_port = self.server_address[:2]

        def server_activate(self):
            pass  # already listening

    server = Server(sock.getsockname(), RendezvousHandler, 0)
    server.init(plan)
    threading.Thread(
        target=server.serve_forever, name="sparkdist-horovod-rendezvous", daemon=True
    ).start()
    return server


class HorovodBackend:
    name = "horovod"

    def prepare(self, ctx: RankContext) -> None:
        install_tensorflow_guard()
        env = ctx.env
        if ctx.launcher == "mpi" or "HOROVOD_GLOO_RENDEZVOUS_ADDR" in env:
            return  # mpirun's environment, or the user's own rendezvous
        if importlib.util.find_spec("horovod") is None:
            return
        rendezvous = ctx.rendezvous
        hostname = f"task-{ctx.node_rank}"  # as the mpi launcher names hosts
        rendezvous.put(f"horovod/slot/{ctx.rank}", (hostname, ctx.local_rank, ctx.local_world_size))
        if ctx.rank == 0:
            hosts = [rendezvous.get(f"horovod/slot/{r}") for r in range(ctx.world_size)]
            sock = listening_socket(ctx.host)
            rendezvous.put("horovod/rendezvous", (ctx.host, sock.getsockname()[1], hosts))
            # The server itself starts when this rank imports Horovod, which it must do
            # before any rank's hvd.init() can complete; jobs without Horovod never pay
            # for importing it.
            plan = host_alloc_plan(hosts)
            after_import(
                "horovod", lambda _module: _servers.append(start_rendezvous_server(sock, plan))
            )
        addr, port, hosts = rendezvous.get("horovod/rendezvous")
        if ctx.rank >= len(hosts):
            # A newcomer to an in-process elastic world (Horovod's world is the first one):
            # its hvd.init() forms a world of one, on Gloo, until `elastic.run` (with an
            # `elastic.HorovodState`) forms the world it joins.
            env.update({"HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"})
            return
        slot = host_alloc_plan(hosts)[ctx.rank]
        try:
            iface = interface_of(ctx.host)[0]
        except ValueError:
            iface = None
        env.update(gloo_env(slot, addr, port))
        if iface:
            env.setdefault("HOROVOD_GLOO_IFACE", iface)
            env.setdefault("NCCL_SOCKET_IFNAME", iface)
