"""The driver's side of checkpoints: a directory on the driver that outlives a job's
attempts, so that a relaunched job resumes where the failed one left off.

Rank 0 sends each checkpoint to the driver over the job's authenticated channel
(`sparkdist.checkpoint.save`), so no storage shared by the executors is needed and a
lost executor loses no checkpoint. Files are written under a temporary name and renamed,
so a reader never sees half a checkpoint; only the newest `keep` are kept.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^checkpoint-(\d{12})\.pkl$")


class CheckpointStore:
    """Checkpoints of one training run, by step, in `directory` on the driver.

    Without a directory, a temporary one is made and `close()` removes it; a directory
    the user names is kept, so a later `run` (even from a new driver) resumes from it.
    """

    def __init__(self, directory: str | os.PathLike | None = None, keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.owned = directory is None
        if directory is None:
            directory = tempfile.mkdtemp(prefix="sparkdist-checkpoints-")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self._lock = threading.Lock()

    def steps(self) -> list[int]:
        found = (_NAME.match(p.name) for p in self.directory.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def _path(self, step: int) -> Path:
        return self.directory / f"checkpoint-{step:012d}.pkl"

    def save(self, step: int, blob: bytes) -> None:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"a checkpoint's step must be an int >= 0, got {step!r}")
        with self._lock:
            tmp = self.directory / f".checkpoint-{step:012d}.{os.getpid()}.tmp"
            tmp.write_bytes(blob)
            os.replace(tmp, self._path(step))
            for old in self.steps()[: -self.keep]:
                self._path(old).unlink(missing_ok=True)
        logger.info("checkpoint of step %d saved (%d bytes) in %s", step, len(blob), self.directory)

    def latest(self) -> tuple[int, bytes] | None:
        """(step, pickled state) of the newest checkpoint, or None."""
        with self._lock:
            steps = self.steps()
            if not steps:
                return None
            return steps[-1], self._path(steps[-1]).read_bytes()

    def close(self) -> None:
        if self.owned:
            shutil.rmtree(self.directory, ignore_errors=True)
