"""A relayed job's stacks, left on the ranks' hosts when the job is cut off.

In relay mode (`runner/driver/launch/relayed.py`) the client reaches no rank, and a
cancelled Spark stage returns nothing. So a rank's supervisor in a relayed job
(`LEFT_STACKS` in its environment) that loses its task (the task's Python worker killed
by the cancel: its parent-death signal; or the job's service, in task 0, gone: its
channel ends) first takes its rank's stacks and NCCL dump, `leave`s them in a file of
its own on its host, and only then stops the rank. The client, once the stage is
cancelled, runs plain Spark tasks (its slots are free again) that `collect` the job's
files on their hosts and return them.

The files hold no secret, are readable by their user only, are removed by the task that
reads them (or by their supervisor when the job's service, alive, aborts the job: its
error carries the stacks), and any left older than `STALE_S` (a job whose client never
asked) is removed by the next one that leaves or collects on that host.
"""

from __future__ import annotations

import base64
import contextlib
import glob
import json
import os
import tempfile
import time

NAME = "sparkdist-left-"
STALE_S = 3600.0
CUT_OFF_LIMIT_S = 20.0
"""At most this long between a supervisor's loss of its task and its exit, whatever the
stacks, the NCCL dump or py-spy take (`stack_dumps.WAIT_S` twice, py-spy's timeout)."""


def job_prefix(job_id: str) -> str:
    """The start of the path of every file a job's supervisors leave on this host."""
    return os.path.join(tempfile.gettempdir(), f"{NAME}{job_id}-")


def leave(prefix: str, rank: int, host: str, text: str, nccl: bytes) -> None:
    """Leave rank `rank`'s stacks ("" when it gave none) for the client's collector."""
    remove_stale()
    path = f"{prefix}rank{rank}"
    entry = {"rank": rank, "host": host, "text": text, "nccl": base64.b64encode(nccl).decode()}
    partial = f"{path}.{os.getpid()}.partial"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(entry, f)
    os.replace(partial, path)


def remove(prefix: str, rank: int) -> None:
    """Remove rank `rank`'s file, if it left one: the job's service, alive, stopped it."""
    with contextlib.suppress(OSError):
        os.unlink(f"{prefix}rank{rank}")


def collect(job_id: str) -> bytes:
    """A plain Spark task's: the job's files on this host (a JSON list of entries), each
    removed once read; a file another task claimed first is that task's."""
    remove_stale()
    entries = []
    for path in glob.glob(f"{glob.escape(job_prefix(job_id))}rank*"):
        if path.endswith(".partial") or ".claimed-" in path:
            continue
        claimed = f"{path}.claimed-{os.getpid()}"
        try:
            os.rename(path, claimed)
        except OSError:
            continue
        try:
            with open(claimed, encoding="utf-8") as f:
                entries.append(json.load(f))
        except (OSError, ValueError):
            pass
        finally:
            with contextlib.suppress(OSError):
                os.unlink(claimed)
    return json.dumps(entries).encode()


def entries(raw: bytes) -> list[tuple[int, str, str, bytes]]:
    """What `collect` returned: (rank, host, stacks, NCCL dump) of each file."""
    return [(e["rank"], e["host"], e["text"], base64.b64decode(e["nccl"])) for e in json.loads(raw)]


def remove_stale(now: float | None = None) -> None:
    """Remove this user's files left longer than `STALE_S` ago, of any job."""
    now = time.time() if now is None else now
    for path in glob.glob(os.path.join(glob.escape(tempfile.gettempdir()), f"{NAME}*")):
        with contextlib.suppress(OSError):
            if os.stat(path).st_uid == os.getuid() and now - os.stat(path).st_mtime > STALE_S:
                os.unlink(path)
