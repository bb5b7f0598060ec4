"""torch.distributed: what `init_process_group("gloo")` with no arguments reads.

Rank 0 reserves a free port on its own host and publishes it through the driver;
the others wait for it. Gloo, NCCL and RPC's TensorPipe are pinned to the interface that carries
the task's address, unless the user chose one.
"""

from __future__ import annotations

from sparkdist.backends.base import RankContext
from sparkdist.network import interface_of, reserve_port


class TorchBackend:
    name = "torch"

    def prepare(self, ctx: RankContext) -> None:
        env = ctx.env
        if "MASTER_ADDR" in env and "MASTER_PORT" in env:
            return
        reservation = None
        if ctx.rank == 0:
            reservation = reserve_port(ctx.host)
            ctx.rendezvous.put("torch/master", (ctx.host, reservation.getsockname()[1]))
        master_host, master_port = ctx.rendezvous.get("torch/master")
        env["MASTER_ADDR"] = master_host
        env["MASTER_PORT"] = str(master_port)
        try:
            ifname, _ = interface_of(ctx.host)
        except ValueError:
            ifname = None
        if ifname:
            env.setdefault("GLOO_SOCKET_IFNAME", ifname)
            env.setdefault("NCCL_SOCKET_IFNAME", ifname)
            # torch.distributed.rpc's TensorPipe transport picks its own otherwise.
            env.setdefault("TP_SOCKET_IFNAME", ifname)
        if reservation is not None:
            reservation.close()
