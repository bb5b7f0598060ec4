"""The job's key-value rendezvous store, kept by the driver for its ranks.

Frameworks exchange start-up values through it (rank 0's TCPStore port, Horovod's
or TensorFlow's cluster addresses): one rank puts, the others wait for the key.
"""

from __future__ import annotations

import threading
import time
from typing import Any


class RendezvousStore:
    """Keys put once, read by any rank; a read waits for its key until a deadline."""

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}
        self._cond = threading.Condition()
        self._closed = False

    def put(self, key: str, value: Any) -> None:
        with self._cond:
            self._values[key] = value
            self._cond.notify_all()

    def get(self, key: str, timeout_s: float) -> tuple[bool, Any]:
        """(True, value) once `key` is there; (False, None) after `timeout_s` or once
        the store is closed (the job is being stopped)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while key not in self._values:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed:
                    return False, None
                self._cond.wait(min(remaining, 0.5))
            return True, self._values[key]

    def close(self) -> None:
        """Wake every waiting read: the job is stopping."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
