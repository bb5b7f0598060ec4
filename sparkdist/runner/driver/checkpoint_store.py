"""The driver's side of checkpoints: a directory that outlives a job's attempts, so
that a relaunched job resumes where the failed one left off.

Rank 0 sends each checkpoint to the job's service over its authenticated channel
(`sparkdist.checkpoint.save`): on the driver, so no storage shared by the executors is
needed and a lost executor loses no checkpoint; in relay mode (`relay.py`), in barrier
task 0, which is why the directory may then be any URL pyarrow or fsspec opens
(`s3://...`, `dbfs:/...`) or a path every executor shares. Files are written under a
temporary name and renamed, so a reader never sees half a checkpoint; only the newest
`keep` are kept.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
from pathlib import Path
from urllib.parse import urlparse

from pyarrow import ArrowInvalid
from pyarrow import fs as pafs

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^checkpoint-(\d{12})\.pkl$")


def open_directory(location: str) -> tuple[pafs.FileSystem, str]:
    """(file system, path in it) for a local path, a pyarrow URL or an fsspec URL."""
    scheme = urlparse(location).scheme
    if scheme in ("", "file"):
        return pafs.LocalFileSystem(), os.path.abspath(urlparse(location).path or location)
    try:
        return pafs.FileSystem.from_uri(location)
    except ArrowInvalid as exc:
        if "Unrecognized filesystem type" not in str(exc):
            raise
    try:
        import fsspec
    except ImportError as exc:
        raise ValueError(
            f"checkpoint_dir {location!r}: pyarrow does not open '{scheme}' URLs and fsspec "
            "is not installed (pip install fsspec and the package for that scheme)"
        ) from exc
    filesystem, path = fsspec.core.url_to_fs(location)
    return pafs.PyFileSystem(pafs.FSSpecHandler(filesystem)), path


class CheckpointStore:
    """Checkpoints of one training run, by step, in `directory`.

    Without a directory, a temporary one is made and `close()` removes it; a directory
    the user names is kept, so a later `run` (even from a new driver) resumes from it.
    """

    def __init__(self, directory: str | os.PathLike | None = None, keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.owned = directory is None
        if directory is None:
            directory = tempfile.mkdtemp(prefix="sparkdist-checkpoints-")
        location = os.fspath(directory)
        self.directory: Path | str = location if urlparse(location).scheme else Path(location)
        self._fs, self._root = open_directory(location)
        self._fs.create_dir(self._root, recursive=True)
        self.keep = keep
        self._lock = threading.Lock()

    def steps(self) -> list[int]:
        infos = self._fs.get_file_info(pafs.FileSelector(self._root))
        found = (_NAME.match(info.base_name) for info in infos)
        return sorted(int(m.group(1)) for m in found if m)

    def _path(self, step: int) -> str:
        return f"{self._root.rstrip('/')}/checkpoint-{step:012d}.pkl"

    def save(self, step: int, blob: bytes) -> None:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"a checkpoint's step must be an int >= 0, got {step!r}")
        with self._lock:
            tmp = f"{self._root.rstrip('/')}/.checkpoint-{step:012d}.{os.getpid()}.tmp"
            with self._fs.open_output_stream(tmp) as out:
                out.write(blob)
            self._fs.move(tmp, self._path(step))
            for old in self.steps()[: -self.keep]:
                self._fs.delete_file(self._path(old))
        logger.info("checkpoint of step %d saved (%d bytes) in %s", step, len(blob), self.directory)

    def latest(self) -> tuple[int, bytes] | None:
        """(step, pickled state) of the newest checkpoint, or None."""
        with self._lock:
            steps = self.steps()
            if not steps:
                return None
            with self._fs.open_input_stream(self._path(steps[-1])) as stream:
                return steps[-1], stream.read()

    def close(self) -> None:
        if self.owned:
            self._fs.delete_dir(self._root)
