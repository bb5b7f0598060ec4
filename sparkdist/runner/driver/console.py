"""Where a job's rank output goes on the driver: its own stdout and stderr, line by
line, so that a notebook cell or a terminal shows the ranks' progress live, and a file
per rank that keeps everything.

So that hundreds of ranks stay readable, a rank's line (`[rank N] text`) is held for
`window_s` before it is shown:
- the same text from `collapse_min` ranks or more within the window shows once, naming
  the ranks (`[ranks 0-255] epoch 1 done`); from fewer ranks, each line shows as it is;
- a progress bar (a line with a carriage return) of a rank other than 0 is not shown;
- beyond `rate` lines a second (after a burst of `burst`), lines are left out with a
  count; never a line that looks like a warning, an error or a traceback (`important`).
Every line of rank N, shown or not, is written to `rank-N.log` in the directory the
console names on its first rank line. `close` shows what is held (the job's end).
"""

from __future__ import annotations

import re
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

WINDOW_S = 0.25
"""How long a rank's line waits for the same line from other ranks."""
COLLAPSE_MIN = 3
"""Fewer ranks than this with the same line: each line shows as today."""
RATE = 100.0
"""Lines a second shown once the burst is spent."""
BURST = 500
MAX_HELD = 20_000
"""Held lines past this are shown at once (a flood does not grow the driver's memory)."""
NOTE_EVERY_S = 1.0
MAX_OPEN_FILES = 128
"""Per-rank files kept open at once (the least recently written is closed first), so
1,024 ranks do not use up the driver's file descriptors."""

RANK_LINE = re.compile(r"\[rank (\d+)\] (.*)", re.S)
IMPORTANT = re.compile(r"error|warn|exception|traceback|critical|fatal", re.I)
"""A line never left out by the rate limit: Python's warnings and exceptions, logging's
WARNING/ERROR/CRITICAL prefixes, `Traceback (most recent call last):`, glog's fatals."""
TRACEBACK_START = "Traceback (most recent call last):"
TRACEBACK_LINKS = ("Traceback", "During handling", "The above exception")


def important(text: str) -> bool:
    return IMPORTANT.search(text) is not None


def spans(ranks: list[int]) -> str:
    """`[0, 1, 2, 5, 7, 8]` -> `"0-2,5,7-8"`."""
    ordered = sorted(set(ranks))
    parts = []
    start = prev = ordered[0]
    for rank in [*ordered[1:], None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if rank is not None:
            start = prev = rank
    return ",".join(parts)


@dataclass
class _Held:
    """One text held for the window, and the ranks that printed it so far."""

    stream: str
    text: str
    since: float
    important: bool
    ranks: list[int] = field(default_factory=list)


class Console:
    """Writes whole lines to stdout or stderr (or the streams given); thread-safe."""

    def __init__(
        self,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
        *,
        log_dir: str | Path | None = None,
        window_s: float = WINDOW_S,
        collapse_min: int = COLLAPSE_MIN,
        rate: float = RATE,
        burst: int = BURST,
    ):
        self._streams = {"stdout": stdout, "stderr": stderr}
        self._lock = threading.Lock()
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._window_s, self._collapse_min = window_s, collapse_min
        self._rate, self._burst = rate, burst
        self._files: OrderedDict[int, TextIO] = OrderedDict()  # open, least recent first
        self._named = False  # the per-rank files' directory was printed
        # by sequence number, oldest first (an OrderedDict: its front is found at once)
        self._held: OrderedDict[int, _Held] = OrderedDict()
        self._next = 0
        self._latest: dict[tuple[str, str], int] = {}  # (stream, text) -> newest held
        self._rank_latest: dict[int, int] = {}  # rank -> its newest held line
        self._in_traceback: set[int] = set()
        self._tokens = float(burst)
        self._refilled = time.monotonic()
        self._left_out = 0
        self._left_out_ranks: set[int] = set()
        self._noted = 0.0
        self._timer: threading.Timer | None = None

    @property
    def log_dir(self) -> Path | None:
        """Where the per-rank files are (None before the first rank line)."""
        return self._log_dir if self._named else None

    def write(self, stream: str, line: str) -> None:
        """Write `line` to `stream` ("stdout" or "stderr"); a rank's line (`[rank N] ...`)
        goes to its file and is shown as the module's docstring says."""
        found = RANK_LINE.fullmatch(line)
        with self._lock:
            if found is None:
                self._show(stream, line)
                return
            rank, text = int(found.group(1)), found.group(2)
            self._keep(rank, text)
            shown = self._visible(rank, text)
            if shown is None:
                return
            self._hold(rank, stream, shown, self._is_important(rank, shown))
            if len(self._held) > MAX_HELD:
                self._flush(everything=True)
            elif self._timer is None:
                self._start_timer(self._window_s)

    def flush(self) -> None:
        """Show every line held, now."""
        with self._lock:
            self._flush(everything=True)
            self._note(force=True)

    def close(self) -> None:
        """The job ended: show what is held, close the per-rank files."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._flush(everything=True)
            self._note(force=True)
            for file in self._files.values():
                file.close()
            self._files.clear()

    # --- under the lock ---------------------------------------------------------------

    def _show(self, stream: str, line: str) -> None:
        out = self._streams[stream] or (sys.stderr if stream == "stderr" else sys.stdout)
        out.write(line + "\n")
        out.flush()

    def _keep(self, rank: int, text: str) -> None:
        """Append the rank's line to its file (opened, and its directory named, once)."""
        if not self._named:
            if self._log_dir is None:
                self._log_dir = Path(tempfile.mkdtemp(prefix="sparkdist-ranks-"))
            self._log_dir.mkdir(parents=True, exist_ok=True)
            where = self._log_dir / "rank-N.log"
            self._show("stderr", f"[sparkdist] each rank's full output: {where}")
            self._named = True
        file = self._files.get(rank)
        if file is None:
            if len(self._files) >= MAX_OPEN_FILES:
                self._files.popitem(last=False)[1].close()
            path = self._log_dir / f"rank-{rank}.log"
            file = self._files[rank] = open(path, "a", encoding="utf-8")  # noqa: SIM115
        else:
            self._files.move_to_end(rank)
        file.write(text + "\n")

    def _visible(self, rank: int, text: str) -> str | None:
        """What of the text is shown: a progress bar (carriage returns) of a rank other
        than 0 is not, unless what follows its last return is important (a warning
        printed over the bar)."""
        if rank == 0 or "\r" not in text:
            return text
        last = text.rsplit("\r", 1)[1]
        return last if important(last) else None

    def _is_important(self, rank: int, text: str) -> bool:
        """Important by its words, or a line of a traceback (its frames are indented; its
        first unindented line, the exception, ends it)."""
        if text.startswith(TRACEBACK_START):
            self._in_traceback.add(rank)
            return True
        if rank in self._in_traceback:
            if not (text[:1].isspace() or not text or text.startswith(TRACEBACK_LINKS)):
                self._in_traceback.discard(rank)
            return True
        return important(text)

    def _hold(self, rank: int, stream: str, text: str, is_important: bool) -> None:
        """Join the held line with the same text, if this rank's lines so far are all
        older than it (a rank's lines stay in order); else hold a new one."""
        key = (stream, text)
        number = self._latest.get(key)
        if number is None or number <= self._rank_latest.get(rank, -1):
            number = self._next
            self._next += 1
            self._held[number] = _Held(stream, text, time.monotonic(), is_important)
            self._latest[key] = number
        self._held[number].ranks.append(rank)
        self._rank_latest[rank] = number

    def _flush(self, everything: bool) -> None:
        """Show the held lines older than the window (or all), oldest first."""
        now = time.monotonic()
        for file in self._files.values():
            file.flush()
        while self._held:
            number, held = next(iter(self._held.items()))
            if not everything and now - held.since < self._window_s:
                break
            del self._held[number]
            if self._latest.get((held.stream, held.text)) == number:
                del self._latest[(held.stream, held.text)]
            for rank in held.ranks:
                if self._rank_latest.get(rank) == number:
                    del self._rank_latest[rank]
            self._emit(held, now)

    def _emit(self, held: _Held, now: float) -> None:
        if len(held.ranks) >= self._collapse_min:
            lines = [f"[ranks {spans(held.ranks)}] {held.text}"]
        else:
            lines = [f"[rank {rank}] {held.text}" for rank in held.ranks]
        self._tokens = min(self._burst, self._tokens + (now - self._refilled) * self._rate)
        self._refilled = now
        for line in lines:
            if held.important or self._tokens >= 1:
                self._tokens -= 0 if held.important else 1
                self._show(held.stream, line)
            else:
                self._left_out += len(held.ranks) if len(lines) == 1 else 1
                self._left_out_ranks.update(held.ranks)

    def _note(self, force: bool = False) -> None:
        """Say how many lines the rate limit left out (at most once a second)."""
        now = time.monotonic()
        if not self._left_out or (not force and now - self._noted < NOTE_EVERY_S):
            return
        self._show(
            "stderr",
            f"[sparkdist] {self._left_out} lines of ranks {spans(list(self._left_out_ranks))} "
            f"not shown (over {self._rate:g} lines a second); every line is in {self._log_dir}",
        )
        self._left_out, self._left_out_ranks, self._noted = 0, set(), now

    def _start_timer(self, delay_s: float) -> None:
        self._timer = threading.Timer(delay_s, self._tick)
        self._timer.daemon = True
        self._timer.start()

    def _tick(self) -> None:
        with self._lock:
            self._timer = None
            self._flush(everything=False)
            self._note()
            if self._held:
                oldest = next(iter(self._held.values()))
                wait = oldest.since + self._window_s - time.monotonic()
                self._start_timer(max(wait, 0.01))
            elif self._left_out:
                self._start_timer(NOTE_EVERY_S)


class RecordingConsole(Console):
    """Keeps the lines, in order, instead of printing them (a relayed job's task 0
    sends them to the client, which prints them)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[str, str]] = []

    def write(self, stream: str, line: str) -> None:
        with self._lock:
            self.lines.append((stream, line))
