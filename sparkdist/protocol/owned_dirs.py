"""Temporary directories that name the process that owns them, and the sweep that removes
those whose owner is gone.

sparkdist's processes make directories in the temp dir and remove them as they end: a
supervisor's `sparkdist-stacks-*`, a Spark task's `sparkdist-<job>-task<i>-*` (and task
0's `...-mpirun-*` and `sparkdist-rsh-*`), the driver's `sparkdist-checkpoints-*` (a store
given no directory). A process that is SIGKILLed (the OOM killer, a cancelled stage's
Python worker, a test's fault) cannot, and its directories piled up (1,500 in a day on a
test machine). So each is made by `make`, which writes an owner file in it: the pid, its
start time (clock ticks since boot, from `/proc/<pid>/stat`), the boot's id and the pid
namespace. Each job's driver and tasks `sweep` their host as they start: a directory of
this user whose owner is certainly gone is removed: made in another boot, or no process
with that pid *and* that start time now (a pid reused by a later process is not the
owner). Kept: a directory without an owner file (made by an older sparkdist, or being
made), another user's, one whose owner is in another pid namespace (it cannot be seen
from here), and any on a system without `/proc`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import tempfile

logger = logging.getLogger(__name__)

PREFIX = "sparkdist-"
OWNER_FILE = ".sparkdist-owner"


def make(prefix: str, root: str | None = None) -> str:
    """`tempfile.mkdtemp(prefix=prefix)` with this process named as its owner."""
    directory = tempfile.mkdtemp(prefix=prefix, dir=root)
    owner = this_owner()
    if owner is not None:
        partial = os.path.join(directory, f"{OWNER_FILE}.partial")
        with open(partial, "w", encoding="utf-8") as f:
            f.write(owner)
        os.replace(partial, os.path.join(directory, OWNER_FILE))
    return directory


def this_owner() -> str | None:
    """This process as an owner file says it: "pid start-ticks boot-id pid-namespace"."""
    return _owner(os.getpid())  # by pid: a forked child is another owner


@functools.cache
def _owner(pid: int) -> str | None:
    start = start_ticks(pid)
    boot, namespace = _boot_id(), _pid_namespace()
    if start is None or boot is None or namespace is None:
        return None
    return f"{pid} {start} {boot} {namespace}"


def start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot; None if there is none."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (name) "; the name may hold ")"
    return int(fields[19])  # field 22 of the whole line: starttime


def owner_gone(owner: str) -> bool:
    """Whether the process an owner file names is certainly gone."""
    try:
        pid, start, boot, namespace = owner.split()
        pid_number, start_number = int(pid), int(start)
    except ValueError:
        return False  # not ours to judge
    if boot != _boot_id():
        return _boot_id() is not None  # another boot: every process of it is gone
    if namespace != _pid_namespace():
        return False  # its pid means another process here: cannot tell
    return start_ticks(pid_number) != start_number


def sweep(root: str | None = None) -> list[str]:
    """Remove this user's `sparkdist-*` directories in `root` (the temp dir) whose owner
    is gone; returns their paths."""
    root = root or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        with contextlib.suppress(OSError, ValueError):  # gone meanwhile, not ours, garbled
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
                continue
            with open(os.path.join(entry.path, OWNER_FILE), encoding="utf-8") as f:
                owner = f.read()
            if owner_gone(owner):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
    if removed:
        logger.info("removed %d directories left by sparkdist processes that died", len(removed))
    return removed


@functools.cache
def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
