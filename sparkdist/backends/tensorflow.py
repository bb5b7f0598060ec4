"""TensorFlow: TF_CONFIG for `tf.distribute.MultiWorkerMirroredStrategy`, one worker per rank,
or for `ParameterServerStrategy` in a job with roles (`sparkdist/roles.py`), whose
worker and ps ranks run their TensorFlow server here (`serve`).

Why: MultiWorkerMirroredStrategy finds its peers only through TF_CONFIG, a JSON list of
every worker's `host:port` plus this worker's index. Each rank picks a free port on its
own task's address, publishes `host:port` through the driver, and rank 0 gathers the
list in rank order and publishes it back.

Free ports without races: the usual "bind port 0, close, hand the number over" leaves a
window in which another process (or an outgoing connection's ephemeral port) can take
the port before TensorFlow binds it, which with TensorFlow's slow import is seconds.
Here the rank keeps its reservation bound for as long as it lives, with SO_REUSEPORT,
and sets TF_GRPC_REUSE_PORT=1 so that TensorFlow's gRPC server binds the same port
beside it (TensorFlow reads that variable in `GrpcServer::Init`). A bound socket that
never listens takes no connections; it only keeps the port out of everyone else's
hands. The reservation is released at the very last moment: when the rank exits.

It runs only when TensorFlow is installed in the rank's environment (a `find_spec`
lookup, no import), and never overrides a TF_CONFIG the user set. In multi-worker
jobs it also arms the fix for Keras 3's multi-worker `fit` (`keras_compat.py`).
TensorFlow's C++ start-up logs are off unless the user set TF_CPP_MIN_LOG_LEVEL
(`sparkdist/native_logs.py`).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import socket
from typing import Any, NoReturn

from sparkdist import native_logs
from sparkdist.backends import keras_compat
from sparkdist.backends.base import RankContext
from sparkdist.roles import ORDER, Roles

logger = logging.getLogger(__name__)

# The rank's port reservation, kept (open) until the process exits.
_reservations: list[socket.socket] = []


def tf_config(workers: list[str], index: int) -> dict[str, Any]:
    """The TF_CONFIG of worker `index` in a cluster of `workers` (`host:port` each)."""
    return {"cluster": {"worker": list(workers)}, "task": {"type": "worker", "index": index}}


def roles_tf_config(addresses: list[str], roles: Roles, rank: int) -> dict[str, Any]:
    """The TF_CONFIG of `rank` in a parameter-server job: every role's `host:port`
    list (ranks in role order) and this rank's role and index."""
    cluster = {
        role: [addresses[r] for r in roles.ranks_of(role)] for role in ORDER if getattr(roles, role)
    }
    role, index = roles.role_of(rank)
    return {"cluster": cluster, "task": {"type": role, "index": index}}


def serve(role: str, index: int) -> NoReturn:
    """A parameter-server job's `worker` or `ps` rank: run this rank's TensorFlow server
    (from TF_CONFIG) until the driver stops the rank, once the chief is done."""
    import tensorflow as tf

    cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster), job_name=role, task_index=index, protocol="grpc", start=True
    )
    logger.info("TensorFlow %s server %d serving at %s", role, index, server.target)
    server.join()  # never returns
    raise AssertionError("tf.distribute.Server.join() returned")


def reserve_shared_port(host: str) -> socket.socket:
    """A socket bound (not listening) to a free port on `host` that a later SO_REUSEPORT
    listener, such as TensorFlow's gRPC server with TF_GRPC_REUSE_PORT=1, can share.

    Not SO_REUSEADDR: with it, any other SO_REUSEADDR socket (a JVM's, by default) may
    bind the port and listen while this one does not, and TensorFlow's server then fails
    ("Could not start gRPC server", seen in a multi-host test)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, 0))
    return sock


class TensorFlowBackend:
    name = "tensorflow"

    def prepare(self, ctx: RankContext) -> None:
        roles = Roles.from_env(ctx.env)
        if importlib.util.find_spec("tensorflow") is None:
            if roles is not None:
                raise RuntimeError(
                    "this parameter-server job (roles=...) needs TensorFlow, which is not "
                    "installed in the ranks' Python environment"
                )
            return
        native_logs.set_default_level(ctx.env)
        if "TF_CONFIG" in ctx.env:
            return
        rendezvous = ctx.rendezvous
        reservation = reserve_shared_port(ctx.host)
        _reservations.append(reservation)
        address = f"{ctx.host}:{reservation.getsockname()[1]}"
        rendezvous.put(f"tensorflow/worker/{ctx.rank}", address)
        if ctx.rank == 0:
            workers = [rendezvous.get(f"tensorflow/worker/{r}") for r in range(ctx.world_size)]
            rendezvous.put("tensorflow/workers", workers)
        else:
            workers = rendezvous.get("tensorflow/workers")
        if roles is not None:
            config = roles_tf_config(workers, roles, ctx.rank)
        else:
            config = tf_config(workers, ctx.rank)
        ctx.env["TF_CONFIG"] = json.dumps(config)
        ctx.env["TF_GRPC_REUSE_PORT"] = "1"
        if ctx.world_size > 1 and roles is None:
            keras_compat.install(ctx.env)
