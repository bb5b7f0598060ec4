"""Starting and stopping the processes of a job so that none outlives it.

Three mechanisms back each other up:

* every process a job starts gets a parent-death signal (Linux `PR_SET_PDEATHSIG`),
  so when its parent dies, for whatever reason, it is killed too;
* every child is started in a process group (or session) of its own, and whoever
  started it kills that whole group on the way out;
* every process is recorded (`ProcessRecord`) with its start time, so the driver and
  the tests can check that exactly those processes are gone, never by name.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import psutil

_PR_SET_PDEATHSIG = 1
_PR_SET_PTRACER = 0x59616D61
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None

# `python -S -c` of this program sets the parent-death signal and then execs the real
# command, so non-Python children (mpirun, orted) die with their parent as well.
_EXEC_WITH_PDEATHSIG = (
    "import ctypes,os,sys;"
    "ctypes.CDLL(None).prctl(1,9);"
    "os.getppid()==int(sys.argv[1]) or os._exit(70);"
    "os.execvp(sys.argv[2],sys.argv[2:])"
)


@dataclass(frozen=True)
class ProcessRecord:
    """A process a job started, identified beyond pid reuse by its start time."""

    host: str
    pid: int
    role: str
    create_time: float

    @classmethod
    def of(cls, pid: int, role: str, host: str) -> ProcessRecord:
        try:
            created = psutil.Process(pid).create_time()
        except psutil.Error:
            created = 0.0
        return cls(host=host, pid=pid, role=role, create_time=created)

    def alive(self) -> bool:
        """Whether this very process still runs (a zombie counts as gone)."""
        try:
            proc = psutil.Process(self.pid)
            return proc.create_time() == self.create_time and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False


def die_with_parent(expected_parent: int | None = None, signum: int = signal.SIGKILL) -> None:
    """Ask the kernel to send this process `signum` (SIGKILL) when its parent exits.

    If the parent already exited before we asked (the race the man page warns of),
    exit now.
    """
    if _libc is None:
        return
    _libc.prctl(_PR_SET_PDEATHSIG, signum)
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(70)


def allow_tracer(pid: int) -> bool:
    """Let process `pid` and its children trace this process (read its memory).

    Where Yama's ptrace_scope is 1 (Ubuntu's default) a process may trace only its own
    descendants, unless it has CAP_SYS_PTRACE (root outside a container). py-spy, which
    a rank's supervisor starts, is the rank's sibling: the rank names its supervisor.
    False where the kernel has no Yama (then nothing restricts it) or this is not Linux.
    """
    return _libc is not None and _libc.prctl(_PR_SET_PTRACER, pid, 0, 0, 0) == 0


def popen_group(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    tie_to_parent: bool = True,
    new_session: bool = False,
    **kwargs,
) -> subprocess.Popen:
    """Start `argv` in a new process group, killed when this process dies.

    Python programs of sparkdist set their own parent-death signal; anything else is
    started through a tiny exec wrapper that sets it (thread-safe, unlike preexec_fn).

    `new_session`: a session of its own rather than just a process group. It decides
    how Linux's autogroup scheduler shares the CPU (per session), so ranks get the
    layout of their framework's own launcher (see `supervisor.rank_in_own_session`).
    """
    argv = list(argv)
    if tie_to_parent and _libc is not None:
        argv = [sys.executable, "-S", "-c", _EXEC_WITH_PDEATHSIG, str(os.getpid()), *argv]
    if new_session:
        group = {"start_new_session": True}
    elif sys.version_info >= (3, 11):
        group = {"process_group": 0}
    else:  # os.setpgrp is a single system call, safe in the forked child
        group = {"preexec_fn": os.setpgrp}
    return subprocess.Popen(argv, env=dict(env), **group, **kwargs)


def stop_group(proc: subprocess.Popen, grace_s: float = 3.0, settle_s: float = 0.0) -> None:
    """Stop a child started by `popen_group`, and everything left in its process group.

    `settle_s`: time the child gets to exit on its own first (a job that finished).
    Then SIGTERM to the group, `grace_s` for the child to exit, and SIGKILL to the
    group for whatever remains. The child is reaped.
    """
    if settle_s:
        try:
            proc.wait(timeout=settle_s)
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is None:
        signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def signal_group(pgid: int, signum: int) -> None:
    """Send `signum` to a process group, if it still exists."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def wait_gone(records: Iterable[ProcessRecord], timeout_s: float) -> list[ProcessRecord]:
    """Wait until the recorded processes have exited; return those still alive."""
    pending = [r for r in records if r.alive()]
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        pending = [r for r in pending if r.alive()]
    return pending


def kill_records(records: Iterable[ProcessRecord]) -> None:
    """SIGKILL recorded processes that are still alive (the last resort)."""
    for record in records:
        if record.alive():
            try:
                os.kill(record.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
