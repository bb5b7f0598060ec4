"""torchrun's rank environment, so frameworks that look for it find the job's world.

Lightning, Accelerate, DeepSpeed and `torch.distributed.elastic` recognise a rank
started by torchrun by TORCHELASTIC_RUN_ID and then read GROUP_RANK, ROLE_RANK and the
rest (the list is torch's `LocalElasticAgent._start_workers`). Without them Lightning
falls back to its MPI environment under mpirun, which derives local ranks from host
names and collides when two executors share a machine. Here a "node" (torchrun's
group) is one Spark task, as NODE_RANK and LOCAL_RANK already are.

TORCHELASTIC_USE_AGENT_STORE is "False": there is no agent-hosted TCPStore, rank 0
hosts it (MASTER_ADDR/MASTER_PORT from the torch backend). TORCHELASTIC_ERROR_FILE is
not set: sparkdist reports the failing rank's traceback itself, and `@record` without
it logs the error as usual. A rank without GPUs from Spark gets ACCELERATE_USE_CPU, as
`accelerate launch --cpu` sets it: Accelerate then joins the Gloo world instead of
training alone.
"""

from __future__ import annotations

import os

from sparkdist import job_environment
from sparkdist.backends.base import RankContext

ROLE_NAME = "default"


def torchrun_env(ctx: RankContext, run_id: str, restart_count: int) -> dict[str, str]:
    """The variables torchrun's agent gives each worker, for this rank's place."""
    return {
        "RANK": str(ctx.rank),
        "WORLD_SIZE": str(ctx.world_size),
        "LOCAL_RANK": str(ctx.local_rank),
        "LOCAL_WORLD_SIZE": str(ctx.local_world_size),
        "GROUP_RANK": str(ctx.node_rank),
        "GROUP_WORLD_SIZE": str(ctx.num_nodes),
        "ROLE_RANK": str(ctx.rank),
        "ROLE_WORLD_SIZE": str(ctx.world_size),
        "ROLE_NAME": ROLE_NAME,
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
    }


class TorchrunBackend:
    name = "torchrun"

    def prepare(self, ctx: RankContext) -> None:
        env = ctx.env
        run_id = env.get(job_environment.JOB_ID) or f"sparkdist-{os.getpid()}"
        env.update(torchrun_env(ctx, run_id, job_environment.attempt(env)))
        env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        if not job_environment.task_gpus(env):
            # Without CUDA, Accelerate's `Accelerator()` makes every rank a world of one
            # unless told the job is on CPU, as `accelerate launch --cpu` tells it.
            env.setdefault("ACCELERATE_USE_CPU", "true")
