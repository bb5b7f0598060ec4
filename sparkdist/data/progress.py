"""Progress of Spark writing a copy, shown on the driver: files, rows and bytes so far.

Spark's write is one action that says nothing until it ends, so a thread watches the
output directory instead: a task's file counts once its task committed it (it is no
longer under an ``attempt_`` directory), and its rows come from its Parquet footer. On a
terminal this is a tqdm bar on stderr, unless logging was configured above INFO (e.g. at
WARNING); elsewhere (a notebook, a log file) it is an INFO log line every
``LOG_EVERY_SECONDS``, shown when ``sparkdist.data`` logs at INFO.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from types import TracebackType

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sparkdist.data import fs

logger = logging.getLogger("sparkdist.data")

POLL_SECONDS = 1.0
LOG_EVERY_SECONDS = 15.0


def _wanted() -> bool:
    """INFO logging is on, or a terminal shows it and nobody configured logging."""
    if logger.isEnabledFor(logging.INFO):
        return True
    configured = bool(logging.getLogger().handlers) or any(
        logging.getLogger(name).level != logging.NOTSET for name in ("sparkdist", logger.name)
    )
    return sys.stderr.isatty() and not configured


class WriteProgress:
    """Context manager: watch `url` while Spark writes Parquet into it."""

    def __init__(self, url: str, *, enabled: bool | None = None) -> None:
        self.url = url
        self.enabled = _wanted() if enabled is None else enabled
        self.rows = 0
        self.files = 0
        self.bytes = 0
        self._counted: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar = None

    def __enter__(self) -> WriteProgress:
        if self.enabled:
            self._started = time.monotonic()
            if sys.stderr.isatty():
                from tqdm.auto import tqdm

                self._bar = tqdm(desc="sparkdist: writing the copy", unit=" rows", leave=False)
            self._thread = threading.Thread(target=self._watch, name="sparkdist-write-progress")
            self._thread.daemon = True
            self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._bar is not None:
            self._bar.close()

    def _watch(self) -> None:
        last_log = time.monotonic()
        while not self._stop.wait(POLL_SECONDS):
            try:
                self._scan()
            except Exception as exc:  # the directory moves under us at job commit
                logger.debug("sparkdist.data: progress scan of %s: %r", self.url, exc)
                continue
            if self._bar is not None:
                self._bar.update(self.rows - self._bar.n)
                self._bar.set_postfix_str(f"{self.files} files, {fs.human_bytes(self.bytes)}")
            elif time.monotonic() - last_log >= LOG_EVERY_SECONDS:
                last_log = time.monotonic()
                logger.info(
                    "sparkdist.data: writing the copy: %d rows in %d files (%s) after %.0f s",
                    self.rows,
                    self.files,
                    fs.human_bytes(self.bytes),
                    time.monotonic() - self._started,
                )

    def _scan(self) -> None:
        """Count the Parquet files tasks have committed so far (each once, by name)."""
        filesystem, path = fs.filesystem_and_path(self.url)
        if filesystem.get_file_info(path).type != pafs.FileType.Directory:
            return
        for info in filesystem.get_file_info(pafs.FileSelector(path, recursive=True)):
            name = info.base_name
            if info.type != pafs.FileType.File or not name.endswith(".parquet"):
                continue
            if "/attempt_" in info.path or name in self._counted:
                continue  # still being written, or seen before (files move at job commit)
            with filesystem.open_input_file(info.path) as handle:
                self.rows += pq.ParquetFile(handle).metadata.num_rows
            self._counted.add(name)
            self.files += 1
            self.bytes += info.size or 0
