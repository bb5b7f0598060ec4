"""The launcher's end of a job on the driver: mpirun's (or a direct launcher's
supervisor process's) last output lines and exit code."""

from __future__ import annotations

import logging
import threading
from collections import deque

from sparkdist.protocol import messages

logger = logging.getLogger(__name__)


class LauncherRecord:
    """What task 0 reported of its launcher, under the job's lock."""

    def __init__(self, cond: threading.Condition):
        self.cond = cond
        self.tail: deque = deque(maxlen=messages.TAIL_LINES)
        self.exit_code: int | None = None
        """mpirun's exit code once it ended (a direct launcher's is not kept)."""

    def output(self, lines: list[str]) -> None:
        with self.cond:
            self.tail.extend(lines)
        for line in lines:
            logger.debug("mpirun: %s", line)

    def exited(self, name: str, exit_code: int) -> None:
        with self.cond:
            if name == "mpirun":
                self.exit_code = exit_code
            self.cond.notify_all()
