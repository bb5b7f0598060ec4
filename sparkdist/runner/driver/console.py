"""Where a job's rank output goes on the driver: its own stdout and stderr, line by
line, so that a notebook cell or a terminal shows the ranks' progress live."""

from __future__ import annotations

import sys
import threading
from typing import TextIO


class Console:
    """Writes whole lines to stdout or stderr (or the streams given); thread-safe."""

    def __init__(self, stdout: TextIO | None = None, stderr: TextIO | None = None):
        self._streams = {"stdout": stdout, "stderr": stderr}
        self._lock = threading.Lock()

    def write(self, stream: str, line: str) -> None:
        """Write `line` to `stream` ("stdout" or "stderr")."""
        out = self._streams[stream] or (sys.stderr if stream == "stderr" else sys.stdout)
        with self._lock:
            out.write(line + "\n")
            out.flush()


class RecordingConsole(Console):
    """Keeps the lines, in order, instead of printing them (a relayed job's task 0
    sends them to the client, which prints them)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[str, str]] = []

    def write(self, stream: str, line: str) -> None:
        with self._lock:
            self.lines.append((stream, line))
