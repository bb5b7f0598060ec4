"""A rank's stacks on its supervisor's request: the contract between the two processes.

The rank (`listen`) answers in a file of the directory its supervisor names
(`SPARKDIST_STACKS`), two ways:

* a thread of the rank waits on a FIFO there; asked, it writes every thread's Python
  stack (`faulthandler.dump_traceback`) holding the GIL. A main thread blocked in a
  collective, a lock or I/O has released the GIL, so this answers at once, and no other
  thread's frames change while they are read;
* `faulthandler` is also registered for `STACK_SIGNAL`, and the supervisor signals when
  the thread gave nothing within `GIL_WAIT_S` (a rank that holds the GIL in C code).
  faulthandler then writes from a C signal handler, without the GIL. That is the last
  resort, not the first: a dump taken while the rank's frames change (a rank importing,
  starting threads) can crash it (CPython gh-116008).

The supervisor (`StackTaker.take`) reads what was appended, waiting a bounded time: a
rank whose handler was replaced, or that is stopped or gone, gives nothing. Where py-spy
is installed (optional; `find_py_spy`) it reads such a rank's Python stacks from its
memory without pausing it (`--nonblocking`: pausing a stopped process fails, so py-spy
gave nothing there before), in about 8 MiB: the rank lets its supervisor's children trace
it (`processes.allow_tracer`). A rank that answered gets py-spy's native stacks (gloo,
NCCL frames) only where `SPARKDIST_PY_SPY_NATIVE=1` asks: `py-spy dump --native` reads
libtorch's symbols, and held 170-330 MiB of the host's memory for its second or so beside
each rank every time a relaunched job showed where its ranks were (the soak's peak
memory, issue 64).

NCCL: torch's flight recorder keeps each rank's last collectives when
`TORCH_FR_BUFFER_SIZE` is set (the supervisor sets it unless the user set it). A
thread of the rank waits on a FIFO in the same directory; when the supervisor writes to
it, the rank dumps its recorder there (`nccl_trace_rank_N`), which torch's `torchfrtrace`
analyses once the driver has gathered every rank's.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import TextIO

from sparkdist import job_environment
from sparkdist.protocol import owned_dirs
from sparkdist.protocol.processes import allow_tracer

STACK_SIGNAL = signal.SIGUSR2
STACK_FIFO = "stacks-request"
"""Written by the supervisor to ask the rank's stacks thread for a dump."""
STACK_FILE = "stacks.txt"
"""Made by the rank once its handler is registered: the supervisor signals only then
(SIGUSR2's default action would end the rank)."""
NCCL_FIFO = "nccl-request"
NCCL_PREFIX = "nccl_trace_rank_"
"""torch's own name for a flight recorder dump (`TORCH_FR_DUMP_TEMP_FILE`'s default)."""
WAIT_S = 3.0
"""How long the supervisor waits for a rank's stacks, and again for its NCCL dump."""
GIL_WAIT_S = 1.5
"""How long the supervisor waits for the rank's stacks thread before it signals."""
QUIET_S = 0.1
"""A dump that has not grown for this long is complete."""
PY_SPY = "py-spy"
PY_SPY_MIN_S = 0.5
"""py-spy gets what is left of `WAIT_S` after the Python stacks, at least this: its
answer must reach the driver, which waits `WAIT_S` + 1 s for the whole of it."""

_file: TextIO | None = None


# --- the rank's side ------------------------------------------------------------------------


def listen(env: Mapping[str, str], rank: int) -> None:
    """Answer the supervisor's stack requests from now on (a no-op outside a job)."""
    global _file
    directory = env.get(job_environment.STACKS)
    if not directory or _file is not None:
        return
    supervisor = env.get(job_environment.SUPERVISOR_PID)
    if supervisor:
        allow_tracer(int(supervisor))  # its py-spy, where it has one, reads this rank
    partial = os.path.join(directory, STACK_FILE + ".partial")
    _file = open(partial, "a", encoding="utf-8")  # noqa: SIM115 - open for the rank's life
    faulthandler.register(STACK_SIGNAL, file=_file, all_threads=True, chain=False)
    if os.path.exists(os.path.join(directory, STACK_FIFO)):
        threading.Thread(
            target=_serve_stacks, args=(directory,), daemon=True, name="sparkdist-stacks"
        ).start()
    os.rename(partial, os.path.join(directory, STACK_FILE))
    fifo = os.path.join(directory, NCCL_FIFO)
    if os.path.exists(fifo):
        threading.Thread(
            target=_serve_nccl, args=(directory, rank), daemon=True, name="sparkdist-nccl-dump"
        ).start()


def _serve_stacks(directory: str) -> None:
    """Dump every thread's stack, holding the GIL, each time the supervisor asks."""
    while True:
        with open(os.path.join(directory, STACK_FIFO), "rb") as request:  # blocks, GIL free
            request.read()
        faulthandler.dump_traceback(file=_file, all_threads=True)


def _serve_nccl(directory: str, rank: int) -> None:
    """Dump the NCCL flight recorder each time the supervisor asks (writes the FIFO)."""
    while True:
        with open(os.path.join(directory, NCCL_FIFO), "rb") as request:  # blocks, GIL free
            request.read()
        data = nccl_trace()  # b"" (none): the supervisor stops waiting at once
        path = os.path.join(directory, f"{NCCL_PREFIX}{rank}")
        with open(path + ".partial", "wb") as out:
            out.write(data or b"")
        os.replace(path + ".partial", path)


def nccl_trace() -> bytes | None:
    """This process's NCCL flight recorder, pickled as torch dumps it; None where the
    rank has no NCCL communicator (torch not imported, no CUDA, a build without it)."""
    torch = sys.modules.get("torch")
    if torch is None or "torch.distributed" not in sys.modules:
        return None
    try:
        if not (torch.cuda.is_initialized() and torch.distributed.is_nccl_available()):
            return None
        from torch._C import _distributed_c10d as c10d

        dump = getattr(c10d, "_dump_fr_trace", None) or getattr(c10d, "_dump_nccl_trace", None)
        return None if dump is None else dump()
    except Exception:  # noqa: BLE001 - best effort, from a helper thread
        return None


# --- the supervisor's side ------------------------------------------------------------------


class StackTaker:
    """A supervisor's half: the directory its rank listens in, and the requests."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.directory = owned_dirs.make("sparkdist-stacks-")
        os.mkfifo(os.path.join(self.directory, STACK_FIFO))
        os.mkfifo(os.path.join(self.directory, NCCL_FIFO))
        env = os.environ if env is None else env
        self.py_spy = find_py_spy(env)
        """py-spy's path, looked up once (None: not installed, or turned off)."""
        self.native = env.get(job_environment.PY_SPY_NATIVE, "") == "1"
        """py-spy adds every rank's native stacks, not only a silent rank's Python ones."""

    def rank_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """What the rank's environment gets: the directory, and the flight recorder on
        unless the user set its size."""
        extra = {job_environment.STACKS: self.directory}
        names = (job_environment.NCCL_TRACE_BUFFER, job_environment.NCCL_TRACE_BUFFER_OLD)
        if not any(name in env for name in names):
            extra[job_environment.NCCL_TRACE_BUFFER] = job_environment.NCCL_TRACE_BUFFER_DEFAULT
        return extra

    def take(self, pid: int, nccl: bool) -> tuple[str, bytes]:
        """Rank `pid`'s stacks (every thread's; py-spy's where it is installed and the
        rank gave none, or native ones asked for) and, with `nccl`, its flight recorder
        dump; empty when the rank does not answer within `WAIT_S`."""
        path = os.path.join(self.directory, STACK_FILE)
        if not os.path.exists(path):
            return "", b""  # not listening yet
        before, started = os.path.getsize(path), time.monotonic()
        fifo = os.path.join(self.directory, STACK_FIFO)
        text = ""
        if _ask(fifo, GIL_WAIT_S):  # the rank's thread answers, holding the GIL
            text = _appended(path, before, started + GIL_WAIT_S - time.monotonic(), pid)
        if not text:  # no thread, or it never got the GIL: the signal handler answers
            try:
                os.kill(pid, STACK_SIGNAL)
            except ProcessLookupError:
                return "", b""
            text = _appended(path, before, started + WAIT_S - time.monotonic(), pid)
        if self.py_spy and (self.native or not text):
            text += self._spied(pid, max(PY_SPY_MIN_S, started + WAIT_S - time.monotonic()), text)
        return text, self._nccl() if nccl else b""

    def _spied(self, pid: int, timeout_s: float, answer: str) -> str:
        """py-spy's stacks of rank `pid`, headed by the command: a rank that gave no
        `answer` is read without being paused (`--nonblocking`, the only way py-spy reads a
        stopped process: pausing one fails), Python frames only; otherwise `--native`."""
        flag = "--native" if answer else "--nonblocking"
        spied = py_spy_dump(self.py_spy, pid, timeout_s, flag)
        if not spied:
            return ""
        label = "native stacks" if answer else "stacks read by py-spy"
        return f"\n{label} (py-spy dump {flag} --pid {pid}):\n{spied}"

    def _nccl(self) -> bytes:
        if not _ask(os.path.join(self.directory, NCCL_FIFO), 0.0):
            return b""  # no rank thread reads it
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            for name in os.listdir(self.directory):
                if name.startswith(NCCL_PREFIX) and not name.endswith(".partial"):
                    with open(os.path.join(self.directory, name), "rb") as f:
                        data = f.read()
                    os.unlink(os.path.join(self.directory, name))
                    return data
            time.sleep(0.05)
        return b""

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def _ask(fifo: str, wait_s: float) -> bool:
    """Write a request to `fifo`; False if no thread has it open within `wait_s` (it
    reopens it after each answer)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: no reader now
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
            continue
        os.write(fd, b"1")
        os.close(fd)
        return True


def _appended(path: str, before: int, wait_s: float, pid: int) -> str:
    """What is appended to `path` after `before` bytes, once it stopped growing (or
    process `pid` ended)."""
    deadline = time.monotonic() + wait_s
    size, changed = before, time.monotonic()
    while time.monotonic() < deadline and _exists(pid):
        now_size = os.path.getsize(path)
        if now_size != size:
            size, changed = now_size, time.monotonic()
        elif size > before and time.monotonic() - changed >= QUIET_S:
            break
        time.sleep(0.02)
    with open(path, "rb") as f:
        f.seek(before)
        return f.read(size - before).decode("utf-8", errors="replace")


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def find_py_spy(env: Mapping[str, str]) -> str | None:
    """py-spy's path for a supervisor with environment `env`: `SPARKDIST_PY_SPY` where
    set (a path; "off" or "0": never), else on `env`'s PATH, else beside the Python
    that runs this process (where pip puts it: a venv's bin is often not on PATH)."""
    chosen = env.get(job_environment.PY_SPY, "")
    if chosen in job_environment.PY_SPY_OFF:
        return None
    if chosen:
        return shutil.which(chosen)
    beside = os.path.dirname(sys.executable)
    return shutil.which(PY_SPY, path=env.get("PATH", "")) or shutil.which(PY_SPY, path=beside)


def py_spy_dump(py_spy: str, pid: int, timeout_s: float, flag: str = "--native") -> str:
    """`py-spy dump FLAG` of `pid`; "" where it fails or takes over `timeout_s`."""
    try:
        done = subprocess.run(
            [py_spy, "dump", flag, "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""
