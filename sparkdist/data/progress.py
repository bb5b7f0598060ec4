"""Progress of Spark writing a copy, shown on the driver: files, rows and bytes so far.

Spark's write is one action that says nothing until it ends, so a thread watches the
output directory instead: a task's file counts once its task committed it (it is no
longer under an ``attempt_`` directory), and its rows come from its Parquet footer. The
display is sparkdist's one progress display (`sparkdist.progress`: a bar in a notebook or
terminal, plain lines elsewhere, nothing when the `sparkdist` logger is above INFO).
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sparkdist import progress
from sparkdist.data import fs

logger = logging.getLogger("sparkdist.data")

POLL_SECONDS = 1.0


class WriteProgress:
    """Context manager: watch `url` while Spark writes Parquet into it."""

    def __init__(self, url: str, *, enabled: bool | None = None) -> None:
        self.url = url
        self.enabled = progress.mode() != "off" if enabled is None else enabled
        self.rows = 0
        self.files = 0
        self.bytes = 0
        self._counted: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: progress.Bar | None = None

    def __enter__(self) -> WriteProgress:
        if self.enabled:
            self._bar = progress.bar(None, "sparkdist: writing the copy", unit="rows")
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
        while not self._stop.wait(POLL_SECONDS):
            try:
                self._scan()
            except Exception as exc:  # the directory moves under us at job commit
                logger.debug("sparkdist.data: progress scan of %s: %r", self.url, exc)
                continue
            self._bar.set(self.rows, files=self.files, size=fs.human_bytes(self.bytes))

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
