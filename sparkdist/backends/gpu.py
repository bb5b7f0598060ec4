"""GPUs: each rank sees exactly the GPUs Spark gave it, in CUDA_VISIBLE_DEVICES.

Why: Spark schedules GPUs per task (`spark.task.resource.gpu.amount`) but does not
hide the other GPUs of the machine from the task's processes. A rank that simply uses
`cuda:0` would then share a device with every other rank on that machine. So the
runner hands each rank its task's GPU addresses (`job_environment.TASK_GPUS`: the barrier
task's `resources()["gpu"]` on the cluster, the driver's `sc.resources["gpu"]` for
`np < 0`), and this backend turns them into CUDA_VISIBLE_DEVICES before the user's code
can initialise CUDA:

* an existing CUDA_VISIBLE_DEVICES (set by the cluster manager or the user) is
  respected: Spark's addresses are then indices into it, as in pyspark's
  TorchDistributor;
* several ranks sharing one task (or the driver) split its GPUs by local rank, in
  contiguous blocks; with fewer GPUs than ranks, ranks share them round robin. Or,
  with SPARKDIST_GPUS_PER=task (as `sparkdist.TorchDistributor` sets it), each sees
  all of them and picks one by LOCAL_RANK, as under torchrun;
* CUDA_DEVICE_ORDER defaults to PCI_BUS_ID, so CUDA numbers devices as nvidia-smi (and
  so the discovery script) does.

A task without GPU resources leaves the environment as it is.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from sparkdist import job_environment
from sparkdist.backends.base import RankContext

logger = logging.getLogger(__name__)


def _parse_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def owned_devices(addresses: Sequence[str], visible: str | None) -> list[str]:
    """What to put in CUDA_VISIBLE_DEVICES for the GPUs at Spark's `addresses`.

    When the process already has a non-empty CUDA_VISIBLE_DEVICES (`visible`), Spark's
    integer addresses index into it (the discovery script ran under that restriction);
    other addresses (GPU UUIDs) name devices themselves and are used as they are.
    """
    if not visible or not visible.strip():
        return list(addresses)
    listed = _parse_list(visible)
    owned = []
    for address in addresses:
        if not address.isdigit():
            owned.append(address)
            continue
        index = int(address)
        if index >= len(listed):
            raise ValueError(
                f"Spark assigned GPU address {address}, but CUDA_VISIBLE_DEVICES={visible!r} "
                f"lists only {len(listed)} devices: with CUDA_VISIBLE_DEVICES set, the "
                "discovery script must report indices into it (0..n-1)"
            )
        owned.append(listed[index])
    return owned


def split_by_local_rank(devices: Sequence[str], local_rank: int, local_size: int) -> list[str]:
    """This local rank's share of its task's devices: a contiguous block of
    len(devices) // local_size of them, or one shared device when there are fewer
    devices than ranks."""
    devices = list(devices)
    if local_size <= 1 or not devices:
        return devices
    if len(devices) >= local_size:
        per_rank = len(devices) // local_size
        return devices[local_rank * per_rank : (local_rank + 1) * per_rank]
    return [devices[local_rank % len(devices)]]


class GpuBackend:
    name = "gpu"

    def prepare(self, ctx: RankContext) -> None:
        env = ctx.env
        addresses = job_environment.task_gpus(env)
        if not addresses:
            return
        devices = owned_devices(addresses, env.get("CUDA_VISIBLE_DEVICES"))
        if job_environment.gpus_shared_by_task(env):
            mine = devices
        else:
            mine = split_by_local_rank(devices, ctx.local_rank, ctx.local_world_size)
        if ctx.local_world_size > len(devices):
            logger.warning(
                "%d ranks share %d GPUs on %s: rank %d uses %s",
                ctx.local_world_size,
                len(devices),
                ctx.host,
                ctx.rank,
                mine,
            )
        env["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")


def torch_process_group_backend() -> str:
    """The backend to name: "nccl" when this rank has a usable GPU, else "gloo", for
    `torch.distributed.init_process_group` in code meant for both.

    (`init_process_group()` without a backend already uses Gloo for CPU tensors and NCCL
    for CUDA tensors; this is for code that names one.)
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not _parse_list(visible):
        return "gloo"  # every GPU hidden from this rank
    import torch

    return "nccl" if torch.cuda.is_available() and torch.distributed.is_nccl_available() else "gloo"
