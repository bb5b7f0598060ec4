"""Where sparkdist's log lines show, and at what level: the one place to set it.

The `sparkdist` logger gets a handler on stderr that writes only while the application
has configured no logging of its own (no handler on the root logger), the way pyspark
shows its own messages; so job starts, trials and progress lines show in a notebook,
and an application that calls `logging.basicConfig` gets them through its own handlers
instead, once.

The level: env `SPARKDIST_LOG_LEVEL` (DEBUG, INFO, WARNING, ERROR; default INFO) when
sparkdist is imported, or `sparkdist.set_log_level(...)` at any time. Above INFO,
progress displays are hidden too (`sparkdist.progress`).
"""

from __future__ import annotations

import logging
import os
import sys

from sparkdist import job_environment

LEVEL_ENV = job_environment.LOG_LEVEL
DEFAULT_LEVEL = "INFO"
FORMAT = "%(levelname)s sparkdist: %(message)s"


class _FallbackHandler(logging.StreamHandler):
    """Writes to the current stderr only while the root logger has no handler."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(FORMAT))

    @property
    def stream(self):  # the stream of the moment: notebooks and tests replace sys.stderr
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            super().emit(record)


def set_log_level(level: int | str) -> None:
    """Set the level of sparkdist's logging (e.g. "WARNING" to see only problems)."""
    logging.getLogger("sparkdist").setLevel(_level(level))


def install() -> None:
    """Give the `sparkdist` logger its fallback handler and level, once per process.

    Not in a rank's processes: there, output goes to the driver as the rank's own
    lines, and sparkdist's INFO lines would only add noise to them.
    """
    root = logging.getLogger("sparkdist")
    if any(isinstance(h, _FallbackHandler) for h in root.handlers):
        return
    if os.environ.get(job_environment.JOB_ID):
        return
    root.addHandler(_FallbackHandler())
    if root.level == logging.NOTSET:
        root.setLevel(_level(os.environ.get(LEVEL_ENV, DEFAULT_LEVEL)))


def _level(level: int | str) -> int:
    if isinstance(level, int) and not isinstance(level, bool):
        return level
    value = logging.getLevelName(str(level).strip().upper())
    if not isinstance(value, int):
        raise ValueError(
            f"log level must be DEBUG, INFO, WARNING or ERROR (e.g. {LEVEL_ENV}=WARNING), "
            f"got {level!r}"
        )
    return value
