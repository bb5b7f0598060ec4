"""What the fixed-size kinds (driver-local, barrier, relayed) share: a world of `np`
ranks every attempt, the driver's checkpoint store, and the relaunch line in the log."""

from __future__ import annotations

import logging

from sparkdist.runner.driver.checkpoint_store import CheckpointStore
from sparkdist.runner.driver.options import RunnerOptions
from sparkdist.runner.driver.retry import Relaunch, RelaunchBudget

logger = logging.getLogger(__name__)


class FixedSizeKind:
    """The part of `api.LaunchKind` every fixed-size kind has in common."""

    def __init__(self, options: RunnerOptions, checkpoints: CheckpointStore | None):
        self.options = options
        self.checkpoints = checkpoints
        """The driver's store; None when they live where barrier task 0 writes them."""

    def relaunching(self, job_id: str, relaunch: Relaunch, budget: RelaunchBudget) -> str:
        if not relaunch.counted:
            logger.warning(
                "sparkdist job %s: mpirun could not start its daemons before any rank "
                "started; launching it once more. Open MPI said:\n%s",
                job_id, "\n".join(relaunch.output_tail),
            )  # fmt: skip
            return relaunch.reason
        logger.warning(
            "sparkdist job %s failed (%s); relaunching it (relaunch %d of at most %d), %s",
            job_id, relaunch.reason, budget.used, budget.max_failures, self.resume_point(),
        )  # fmt: skip
        return relaunch.reason

    def resume_point(self) -> str:
        if self.checkpoints is None:
            return f"from the newest checkpoint in {self.options.checkpoint_dir}"
        steps = self.checkpoints.steps()
        return (
            f"from the checkpoint of step {steps[-1]}"
            if steps
            else "from scratch (no checkpoint saved yet)"
        )

    def close(self) -> None:
        if self.checkpoints is not None:
            self.checkpoints.close()
