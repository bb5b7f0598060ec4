"""The driver's half of checkpoints (the rank's half, in `checkpoint/rank/`, is
`driver_path.py`, `sharded.py` and `tensorflow.py`, which send the messages this half
answers): the record of what was committed, which outlives a job's attempts, so that a
relaunched (or resized) job resumes where the last one left off.

Two kinds of checkpoint share one sequence of steps:

* **driver path**: rank 0 sends its pickled state over the job's authenticated channel
  (`sparkdist.checkpoint.save`) and it is written here as `checkpoint-<step>.pkl`. No
  storage shared by the executors is needed and a lost executor loses no checkpoint.
* **sharded**: every rank writes its shard (torch.distributed.checkpoint, or TensorFlow's
  CheckpointManager) under `<directory>/sharded/step-<step>-<job>/`; once every shard and
  the metadata are down, rank 0 commits the step: a small JSON record
  `checkpoint-<step>.commit.json` (step, world size, location, kind). Only committed
  steps exist for `latest`: a directory left by a crash mid-save is never read and is
  removed by the next commit at or past its step.

One store is opened per job on the driver (`runner/driver/job.py`) and handed to every
attempt, whose service passes it the ranks' checkpoint messages (`REQUESTS`): the store
answers them (`CheckpointStore.answer`). In relay mode (a Spark Connect client the
executors cannot reach) the store lives in barrier task 0 instead, and the client holds
a `NoStore` that only says where the job resumes from; that is why the directory may be
any URL pyarrow or fsspec opens (`s3://...`, `dbfs:/...`) or a path every executor
shares. Files are written under a temporary name and renamed, so a reader never sees
half a record.

Retention (`expired`): only the newest `keep` checkpoints are kept, of either kind, but
never one a resumed rank is still reading (`latest(reader)` pins it until `unpin`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pyarrow import ArrowInvalid
from pyarrow import fs as pafs

from sparkdist.protocol import messages, owned_dirs

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^checkpoint-(\d{12})\.(pkl|commit\.json)$")
_SHARD_DIR = re.compile(r"^step-(\d{12})-([0-9a-zA-Z]+)")
SHARDED = "sharded"
"""The subdirectory of the checkpoint directory that holds the ranks' shards."""
REQUESTS = (
    messages.CheckpointSave,
    messages.CheckpointPlace,
    messages.CheckpointCommit,
    messages.CheckpointLatest,
    messages.CheckpointLoaded,
    messages.CheckpointSteps,
)
"""The ranks' checkpoint messages, which the job's store answers (`answer`)."""

Reader = tuple[str, int]
"""(job id, rank): a rank that reads checkpoints, and pins the one it loads."""
Stored = Callable[[int], str | None]
"""The job's answer once a rank's step is stored: "grow" when an elastic job stops there."""


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


def expired(steps: list[int], keep: int, pinned: set[int]) -> list[int]:
    """The retention rule: the steps to remove, all but the newest `keep`, except those
    a resumed rank is still loading (`pinned`)."""
    return [step for step in sorted(steps)[:-keep] if step not in pinned]


class CheckpointStore:
    """Checkpoints of one training run, by step, in `directory`.

    Without a directory, a temporary one is made and `close()` removes it (sharded saves
    then have nowhere every rank sees, and are refused); a directory the user names is
    kept, so a later `run` (even from a new driver) resumes from it.
    """

    def __init__(self, directory: str | os.PathLike | None = None, keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.owned = directory is None
        if directory is None:
            directory = owned_dirs.make("sparkdist-checkpoints-")
        location = os.fspath(directory)
        scheme = urlparse(location).scheme
        self.directory: Path | str = location if scheme else Path(location)
        self._fs, self._root = open_directory(location)
        self._fs.create_dir(self._root, recursive=True)
        # Where ranks write shards: the URL as given, or the absolute local path.
        self._shard_base = (
            f"{location.rstrip('/')}/{SHARDED}"
            if scheme not in ("", "file")
            else os.path.join(self._root, SHARDED)
        )
        self.keep = keep
        self._lock = threading.Lock()
        self._pins: dict[Any, int] = {}
        """reader (job id, rank) -> the sharded step it is loading."""

    # --- what exists ------------------------------------------------------------------

    def _records(self) -> dict[int, str]:
        """step -> file name of its record (a commit wins over a pickle of one step)."""
        found: dict[int, str] = {}
        for info in self._fs.get_file_info(pafs.FileSelector(self._root)):
            match = _NAME.match(info.base_name)
            if match and (int(match.group(1)) not in found or match.group(2) != "pkl"):
                found[int(match.group(1))] = info.base_name
        return found

    def steps(self) -> list[int]:
        return sorted(self._records())

    def _file(self, name: str) -> str:
        return f"{self._root.rstrip('/')}/{name}"

    # --- driver path ------------------------------------------------------------------

    def save(self, step: int, blob: bytes) -> None:
        _check_step(step)
        with self._lock:
            self._write(f"checkpoint-{step:012d}.pkl", blob)
            self._prune()
        logger.info("checkpoint of step %d saved (%d bytes) in %s", step, len(blob), self.directory)

    def _write(self, name: str, data: bytes) -> None:
        tmp = self._file(f".{name}.{os.getpid()}.tmp")
        with self._fs.open_output_stream(tmp) as out:
            out.write(data)
        self._fs.move(tmp, self._file(name))

    # --- sharded ----------------------------------------------------------------------

    def shard_location(self, step: int, job_id: str, suffix: str = "") -> str:
        """Where the ranks of job `job_id` write the shards of `step` (a path or URL every
        executor must see). Refused for a temporary directory on the driver."""
        _check_step(step)
        if self.owned:
            raise ValueError(
                "a sharded checkpoint is written by every rank to storage they all see, "
                "and this job has none: pass HorovodRunner(checkpoint_dir=...) a directory "
                "every executor shares (/dbfs/..., /Volumes/..., a mounted file system, or "
                "an fsspec URL such as s3://bucket/run)"
            )
        if not re.fullmatch(r"[0-9a-zA-Z]+", job_id) or not re.fullmatch(r"[0-9a-zA-Z-]*", suffix):
            raise ValueError(f"bad checkpoint name parts {job_id!r}, {suffix!r}")
        name = f"step-{step:012d}-{job_id}" + (f"-{suffix}" if suffix else "")
        self._fs.create_dir(f"{self._root.rstrip('/')}/{SHARDED}", recursive=True)
        return f"{self._shard_base}/{name}"

    def commit(self, step: int, world_size: int, location: str, kind: str) -> None:
        """Record `step` as written by every rank at `location`: from now on it is the
        checkpoint a relaunch resumes from (if it is the newest)."""
        _check_step(step)
        if not location.startswith(self._shard_base + "/"):
            raise ValueError(f"checkpoint {step}: {location!r} is not under {self._shard_base}")
        record = {
            "step": step,
            "world_size": world_size,
            "location": location,
            "name": location[len(self._shard_base) + 1 :],
            "kind": kind,
            "committed_at": time.time(),
        }
        with self._lock:
            self._write(f"checkpoint-{step:012d}.commit.json", json.dumps(record).encode())
            self._remove_uncommitted(step, record["name"])
            self._prune()
        logger.info(
            "checkpoint of step %d committed (%s, %d ranks) at %s", step, kind, world_size, location
        )

    def _remove_uncommitted(self, step: int, keep_name: str) -> None:
        """Shard directories no commit names, left by a save that did not finish, up to
        `step` (a later step's directory may be one the ranks are starting to write)."""
        committed = {
            self._read_record(n)["name"]
            for n in self._records().values()
            if n.endswith(".commit.json")
        }
        base = f"{self._root.rstrip('/')}/{SHARDED}"
        infos = self._fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
        for info in infos:
            match = _SHARD_DIR.match(info.base_name)
            if not match or info.base_name in committed or int(match.group(1)) > step:
                continue
            if int(match.group(1)) == step and info.base_name.startswith(keep_name):
                continue  # this save's own helper directories: their ranks remove them
            logger.info("removing %s: a checkpoint that was never committed", info.base_name)
            _delete(self._fs, info)

    def _read_record(self, name: str) -> dict:
        with self._fs.open_input_stream(self._file(name)) as stream:
            return json.loads(stream.read())

    # --- reading ----------------------------------------------------------------------

    def latest(self, reader: Any = None) -> tuple[int, bytes | dict] | None:
        """(step, pickled state) or (step, commit record) of the newest checkpoint, or
        None. A sharded one is pinned for `reader` until `unpin(reader)`."""
        with self._lock:
            records = self._records()
            if not records:
                return None
            step = max(records)
            if records[step].endswith(".pkl"):
                with self._fs.open_input_stream(self._file(records[step])) as stream:
                    return step, stream.read()
            if reader is not None:
                self._pins[reader] = step
            return step, self._read_record(records[step])

    def unpin(self, reader: Any) -> None:
        """`reader` has loaded its checkpoint (or is gone): it may now be removed."""
        with self._lock:
            if self._pins.pop(reader, None) is not None:
                self._prune()

    def _prune(self) -> None:
        """Remove what the retention rule (`expired`) no longer keeps."""
        records = self._records()
        for step in expired(list(records), self.keep, set(self._pins.values())):
            name = records[step]
            if name.endswith(".commit.json"):
                shards = f"{self._root.rstrip('/')}/{SHARDED}/{self._read_record(name)['name']}"
                self._fs.delete_file(self._file(name))  # the record first: never half-read
                _delete(self._fs, self._fs.get_file_info(shards))
            else:
                self._fs.delete_file(self._file(name))
            pickle = self._file(f"checkpoint-{step:012d}.pkl")
            if name.endswith(".commit.json") and self._fs.get_file_info(pickle).is_file:
                self._fs.delete_file(pickle)

    # --- the ranks' messages ----------------------------------------------------------

    def answer(self, request: tuple, reader: Reader, stored: Stored) -> tuple:
        """The reply to `reader`'s checkpoint message (one of `REQUESTS`): `Ok(...)`, or
        `Failed(error)` for a save, place or commit that could not be done. A stored
        step's `Ok` carries the job's answer to it, `stored(step)`."""
        job_id = reader[0]
        match request:
            case messages.CheckpointSave(step, blob):
                return _done(step, lambda: self.save(step, blob), stored)
            case messages.CheckpointPlace(step, suffix):
                return _done(step, lambda: self.shard_location(step, job_id, suffix))
            case messages.CheckpointCommit(step, world_size, location, kind):
                return _done(step, lambda: self.commit(step, world_size, location, kind), stored)
            case messages.CheckpointLatest():
                return messages.Ok(self.latest(reader))
            case messages.CheckpointLoaded():
                self.unpin(reader)
                return messages.Ok()
            case messages.CheckpointSteps():
                return messages.Ok(self.steps())
        raise ValueError(f"not a checkpoint message: {request!r}")

    def resume_point(self) -> str:
        """Where a relaunch resumes from, for the driver's log."""
        steps = self.steps()
        return f"step {steps[-1]}" if steps else "scratch (no checkpoint saved yet)"

    def close(self) -> None:
        if self.owned:
            self._fs.delete_dir(self._root)


class NoStore:
    """The checkpoints of a job kept elsewhere: in `directory`, by a relayed job's barrier
    task 0 (the client that holds this sees none of them), or nowhere (a job state
    made without a store). A rank that asks anyway is answered as a job with no store."""

    def __init__(self, directory: str | os.PathLike | None = None):
        self.directory = directory

    def answer(self, request: tuple, reader: Reader, stored: Stored) -> tuple:
        match request:
            case messages.CheckpointLatest():
                return messages.Ok(None)
            case messages.CheckpointSteps():
                return messages.Ok([])
            case messages.CheckpointLoaded():
                return messages.Ok()
        return messages.Failed("this job has no checkpoint store")

    def unpin(self, reader: Reader) -> None:
        """Nothing is pinned here."""

    def resume_point(self) -> str:
        return f"the newest checkpoint in {self.directory}"

    def close(self) -> None:
        """Nothing to release: the directory is another process's."""


def _done(step: int, action: Callable[[], Any], stored: Stored | None = None) -> tuple:
    """`Ok` with `action()`'s value (or, for a stored step, `stored(step)`), or `Failed`
    saying why it could not be done."""
    try:
        value = action()
    except (OSError, ValueError) as exc:
        logger.warning("checkpoint %s: %s", step, exc)
        return messages.Failed(str(exc))
    return messages.Ok(stored(step) if stored is not None else value)


def _check_step(step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"a checkpoint's step must be an int >= 0, got {step!r}")


def _delete(fs: pafs.FileSystem, info: pafs.FileInfo) -> None:
    try:
        if info.type == pafs.FileType.Directory:
            fs.delete_dir(info.path)
        elif info.type == pafs.FileType.File:
            fs.delete_file(info.path)
    except (OSError, FileNotFoundError) as exc:  # removed concurrently: fine
        logger.debug("could not remove %s: %s", info.path, exc)
