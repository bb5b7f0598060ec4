"""Where every rank's full output is kept: `rank-N.log` per rank, one directory per
attempt of a run (`HorovodRunner.run`), written live on the driver's local disk.

* **On the driver**: `<tmp>/sparkdist-ranks/<run>/attempt-<k>/rank-N.log`, where `<tmp>`
  is the system's temporary directory (`TMPDIR`) and `<run>` is
  `<UTC time>-<first attempt's job id>`, so that names sort by age. A run's first line
  removes the oldest run directories beyond the newest `KEEP_RUNS`, but never one still
  being written: each attempt holds a lock on its run directory until its end, so another
  notebook's job or a parallel tune trial keeps its files.
* **Under the job's checkpoint directory**, when it has one (`checkpoint_dir`): at each
  attempt's end its directory is copied to `<checkpoint_dir>/logs/<run>/attempt-<k>/`,
  through the file system the checkpoints use (a local path, `/dbfs`, `/Volumes`, or an
  fsspec URL such as `s3://`). Only whole files are copied, once: object stores and
  Databricks volumes do not take appends. Nothing removes that copy.
"""

from __future__ import annotations

import fcntl
import logging
import shutil
import tempfile
import time
from collections import OrderedDict
from pathlib import Path
from typing import TextIO

from pyarrow import fs as pafs

from sparkdist.checkpoint.driver.store import open_directory

logger = logging.getLogger(__name__)

KEEP_RUNS = 10
"""Run directories kept on the driver: the newest ten (every attempt of each)."""
MAX_OPEN_FILES = 128
"""Per-rank files kept open at once (the least recently written is closed first), so
1,024 ranks do not use up the driver's file descriptors."""
LOCK = ".lock"
"""A run directory's lock file: locked while one of its attempts writes."""


def driver_root() -> Path:
    """The directory of the run directories on the driver."""
    return Path(tempfile.gettempdir()) / "sparkdist-ranks"


class RunLogs:
    """The log directories of one run: one per attempt, under one run directory (named
    by the first attempt that writes), copied under `copy_to` if given."""

    def __init__(self, copy_to: str | None = None, root: Path | None = None):
        self.root = root if root is not None else driver_root()
        self.copy_to = copy_to.rstrip("/") + "/logs" if copy_to else None
        self._name: str | None = None

    def attempt(self, number: int, job_id: str) -> RankFiles:
        """The files of attempt `number` (0 for the first) of job id `job_id`."""
        self._name_run(job_id)
        part = f"{self._name}/attempt-{number + 1}"
        return RankFiles(
            self.root / part,
            run=self.root / self._name,
            keep_runs=KEEP_RUNS,
            copy_to=f"{self.copy_to}/{part}" if self.copy_to else None,
        )

    def _name_run(self, job_id: str) -> None:
        if self._name is None:
            self._name = f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{job_id}"

    def keep(self, name: str, data: bytes, job_id: str = "job") -> Path:
        """Write a file of the whole run (its trace) into the run directory, and copy it
        under `copy_to` (if any); returns its path on the driver."""
        self._name_run(job_id)
        path = self.root / self._name / name
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(name + ".partial")
        partial.write_bytes(data)
        partial.replace(path)
        if self.copy_to:
            try:
                filesystem, directory = open_directory(f"{self.copy_to}/{self._name}")
                filesystem.create_dir(directory, recursive=True)
                with filesystem.open_output_stream(f"{directory}/{name}") as out:
                    out.write(data)
            except Exception as exc:  # noqa: BLE001 - the file stays on the driver
                logger.warning("could not copy %s to %s: %s", path, self.copy_to, exc)
        return path


class RankFiles:
    """The `rank-N.log` files of one attempt, in `directory` (made at the first line).
    With `run`, the attempt locks that run directory while it writes and removes the
    oldest of its siblings beyond `keep_runs`; `close` copies the files to `copy_to`."""

    def __init__(
        self,
        directory: str | Path,
        *,
        run: Path | None = None,
        keep_runs: int = KEEP_RUNS,
        copy_to: str | None = None,
    ):
        self.directory = Path(directory)
        self._run, self._keep_runs, self._copy_to = run, keep_runs, copy_to
        self._files: OrderedDict[int, TextIO] = OrderedDict()  # open, least recent first
        self._lock: TextIO | None = None
        self.made = False
        """Whether the directory was made (by the first line)."""

    def make(self) -> None:
        """Make the directory now (files other than rank lines go there too)."""
        if not self.made:
            self._make()

    def write(self, rank: int, text: str) -> None:
        """Append a line to rank `rank`'s file."""
        self.make()
        file = self._files.get(rank)
        if file is None:
            if len(self._files) >= MAX_OPEN_FILES:
                self._files.popitem(last=False)[1].close()
            path = self.directory / f"rank-{rank}.log"
            file = self._files[rank] = open(path, "a", encoding="utf-8")  # noqa: SIM115
        else:
            self._files.move_to_end(rank)
        file.write(text + "\n")

    def flush(self) -> None:
        for file in self._files.values():
            file.flush()

    def close(self) -> str | None:
        """Close the files, copy them under `copy_to` (if any) and release the run's
        lock; returns where they were copied (None: not copied)."""
        for file in self._files.values():
            file.close()
        self._files.clear()
        copied = self._copy() if self.made else None
        if self._lock is not None:
            self._lock.close()  # releases the lock
            self._lock = None
        return copied

    def _make(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.made = True
        if self._run is None:
            return
        self._lock = open(self._run / LOCK, "a")  # noqa: SIM115 - held until close
        fcntl.flock(self._lock, fcntl.LOCK_SH)
        remove_old_runs(self._run.parent, self._keep_runs, keep=self._run)

    def _copy(self) -> str | None:
        if self._copy_to is None:
            return None
        try:
            filesystem, path = open_directory(self._copy_to)
            filesystem.create_dir(path, recursive=True)
            pafs.copy_files(
                str(self.directory),
                path,
                source_filesystem=pafs.LocalFileSystem(),
                destination_filesystem=filesystem,
            )
        except Exception as exc:  # noqa: BLE001 - the files stay on the driver
            logger.warning(
                "could not copy the rank logs %s to %s: %s", self.directory, self._copy_to, exc
            )
            return None
        return self._copy_to


def remove_old_runs(root: Path, keep_runs: int, keep: Path | None = None) -> list[Path]:
    """The retention rule: remove the run directories of `root` beyond the newest
    `keep_runs` (by name: they start with their UTC time), except `keep` and those an
    attempt still writes (locked). Returns those removed."""
    runs = sorted(path for path in root.iterdir() if path.is_dir() and path != keep)
    removed = []
    for run in runs[: max(len(runs) - (keep_runs - (keep is not None)), 0)]:
        if _in_use(run):
            continue
        shutil.rmtree(run, ignore_errors=True)
        removed.append(run)
    return removed


def _in_use(run: Path) -> bool:
    try:
        with open(run / LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False  # no lock file to open: a directory of no attempt
    return False
