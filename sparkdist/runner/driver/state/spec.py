"""What a job is, as the driver tells every rank when it says hello."""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkdist.protocol import messages
from sparkdist.roles import SERVERS, Roles


@dataclass
class JobSpec:
    """What the driver tells every rank when it says hello."""

    job_id: str
    num_ranks: int
    payload: bytes
    all_results: bool
    log_mode: str
    ranks_per_task: int = 1
    """Task i runs ranks i * ranks_per_task ... (i + 1) * ranks_per_task - 1."""
    roles: Roles | None = None
    """A parameter-server job's roles: its server ranks stop when the chief is done."""
    rank0_env: messages.SecretEnv = field(default_factory=messages.SecretEnv, repr=False)
    """Credentials only rank 0 gets (with its `Welcome`, over the encrypted channel)."""

    def server_rank(self, rank: int) -> bool:
        return self.roles is not None and self.roles.role_of(rank)[0] in SERVERS

    def tolerates_loss(self, rank: int) -> bool:
        """A parameter-server worker: its coordinator reschedules what it was running."""
        return self.roles is not None and self.roles.role_of(rank)[0] == "worker"

    @property
    def num_tasks(self) -> int:
        return self.num_ranks // self.ranks_per_task
