"""A job's Spark tasks as the driver sees them: which connected, which said they were
done, which were lost (and why), and where each task's agent listens."""

from __future__ import annotations

import threading
import time

from sparkdist.protocol import messages


class SparkTasks:
    """The tasks of one job, under the job's lock."""

    def __init__(self, num_tasks: int, cond: threading.Condition):
        self.cond = cond
        self.num_tasks = num_tasks
        self.started: set[int] = set()
        self.done: set[int] = set()
        self.lost: dict[int, str] = {}
        """Tasks whose agent connection broke before they finished, with why."""
        self.places: dict[int, messages.AgentPlace] = {}

    def connected(self, index: int) -> None:
        with self.cond:
            self.started.add(index)

    def finished(self, index: int) -> None:
        """Task `index` said it was done."""
        with self.cond:
            self.done.add(index)
            self.cond.notify_all()

    def lost_contact(self, index: int, reason: str) -> None:
        with self.cond:
            self.lost[index] = reason

    def placed(self, index: int, place: messages.AgentPlace) -> list[messages.AgentPlace] | None:
        """Task `index`'s agent listens at `place`; every task's place, in task order,
        once all are known."""
        with self.cond:
            self.places[index] = place
            if sorted(self.places) != list(range(self.num_tasks)):
                return None
            return [self.places[i] for i in range(self.num_tasks)]

    def live_count(self) -> int:
        """How many tasks connected and were not lost: those whose end to await."""
        with self.cond:
            return len(self.started - self.lost.keys())

    def wait_done(self, count: int, timeout_s: float) -> bool:
        """Whether `count` tasks said they were done within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while len(self.done) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.cond.wait(min(remaining, 0.2))
        return True
