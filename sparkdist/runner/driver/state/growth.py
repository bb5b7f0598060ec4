"""An elastic job's growth: when more slots stay free, rank 0 is asked to stop at its
next checkpoint, so that the job relaunches larger and resumes from there
(`runner/driver/launch/elastic.py` decides when; `failures.WorldResize` ends the attempt)."""

from __future__ import annotations

import threading


class Growth:
    """Whether the world should grow, and whether rank 0 was told to stop for it."""

    def __init__(self, cond: threading.Condition):
        self.cond = cond
        self.reason: str | None = None
        """Why the world should grow, once it should."""
        self.resizing: str | None = None
        """Rank 0 was told to stop after its checkpoint, so the job can grow: why."""

    def request(self, reason: str) -> None:
        """Ask rank 0 to stop at its next checkpoint, so the job relaunches larger."""
        with self.cond:
            self.reason = reason

    def answer_checkpoint(self, rank: int, step: int) -> str | None:
        """After rank `rank` stored checkpoint `step`: "grow" when the job should stop
        there to grow (rank 0 then ends), else None."""
        with self.cond:
            if rank != 0 or self.reason is None or self.resizing is not None:
                return None
            self.resizing = f"{self.reason}; resuming from step {step}"
            return "grow"
