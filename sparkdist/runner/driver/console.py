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
Every line of rank N, shown or not, is written to its `rank-N.log` (`rank_logs.py` says
where), whose directory the console names on its first rank line. `close` shows what is
held (the job's end) and where the files were copied, if they were.
"""

from __future__ import annotations

import re
import sys
import threading
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from sparkdist.runner.driver.rank_logs import RankFiles, RunLogs

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
    members: set[int] = field(default_factory=set)
    """The same ranks, to look up."""


class HeldLines:
    """The rank lines held for the window: a line from several ranks is held once, and
    they are taken in an order that keeps each rank's lines in the order it printed them."""

    def __init__(self) -> None:
        # by sequence number, oldest first (an OrderedDict: its front is found at once)
        self._held: OrderedDict[int, _Held] = OrderedDict()
        self._next = 0
        self._latest: dict[tuple[str, str], int] = {}  # (stream, text) -> newest held
        self._pending: dict[int, deque[int]] = {}  # rank -> its held lines, in order
        self._newest_shared: dict[int, int] = {}  # rank -> its newest held line shared

    def __len__(self) -> int:
        return len(self._held)

    def oldest(self) -> _Held:
        return next(iter(self._held.values()))

    def add(self, rank: int, stream: str, text: str, is_important: bool) -> None:
        """Join the newest held line with the same text, unless this rank is in it
        already or has a line held after it that other ranks share; else hold a new one.
        A rank's own lines held after the joined one (`rank 5 loaded its shard`, then
        `epoch 1 done`) are taken before it (`_take`), so its lines stay in order."""
        key = (stream, text)
        number = self._latest.get(key)
        if (
            number is None
            or rank in self._held[number].members
            or self._newest_shared.get(rank, -1) > number
        ):
            number = self._next
            self._next += 1
            self._held[number] = _Held(stream, text, time.monotonic(), is_important)
            self._latest[key] = number
        held = self._held[number]
        held.ranks.append(rank)
        held.members.add(rank)
        self._pending.setdefault(rank, deque()).append(number)
        if len(held.ranks) > 1:  # shared (by its first two ranks, from now on)
            for member in held.ranks if len(held.ranks) == 2 else [rank]:
                self._newest_shared[member] = max(self._newest_shared.get(member, -1), number)

    def take(self, held_since: float | None) -> list[_Held]:
        """Remove and return the lines held since before `held_since` (None: all), oldest
        first, each after the lines its ranks printed before it."""
        taken: list[_Held] = []
        while self._held:
            number, held = next(iter(self._held.items()))
            if held_since is not None and held.since > held_since:
                break
            self._take(number, taken)
        return taken

    def _take(self, number: int, taken: list[_Held]) -> None:
        """Depth first, without recursion: chains of ranks can be long."""
        stack = [number]
        while stack:
            top = stack[-1]
            earlier = {
                e
                for r in self._held[top].ranks
                for e in self._before(r, top)
                if e in self._held and e not in stack
            }
            if earlier:
                stack.extend(sorted(earlier, reverse=True))  # the oldest first
                continue
            stack.pop()
            held = self._held.pop(top)
            for rank in held.ranks:
                self._pending[rank].remove(top)
                if self._newest_shared.get(rank) == top:
                    del self._newest_shared[rank]
            if self._latest.get((held.stream, held.text)) == top:
                del self._latest[(held.stream, held.text)]
            taken.append(held)

    def _before(self, rank: int, number: int):
        """The rank's held lines before `number`, in its order."""
        for earlier in self._pending[rank]:
            if earlier == number:
                return
            yield earlier


class Console:
    """Writes whole lines to stdout or stderr (or the streams given); thread-safe. The
    rank files go to `files` (an attempt's, `rank_logs.RunLogs.attempt`), or straight
    into `log_dir`, or else into a run of their own on the driver."""

    def __init__(
        self,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
        *,
        files: RankFiles | None = None,
        log_dir: str | Path | None = None,
        window_s: float = WINDOW_S,
        collapse_min: int = COLLAPSE_MIN,
        rate: float = RATE,
        burst: int = BURST,
    ):
        self._streams = {"stdout": stdout, "stderr": stderr}
        self._lock = threading.Lock()
        if files is None:  # a directory of the caller's, kept as it is; else a new run's
            files = RankFiles(log_dir) if log_dir else RunLogs().attempt(0, uuid.uuid4().hex[:12])
        self._files = files
        self._window_s, self._collapse_min = window_s, collapse_min
        self._rate, self._burst = rate, burst
        self._held = HeldLines()
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
        return self._files.directory if self._files.made else None

    def write(self, stream: str, line: str) -> None:
        """Write `line` to `stream` ("stdout" or "stderr"); a rank's line (`[rank N] ...`)
        goes to its file and is shown as the module's docstring says."""
        found = RANK_LINE.fullmatch(line)
        if stream == "file" and found is not None:  # replayed: for the rank's file only
            self.keep(int(found.group(1)), [found.group(2)])
            return
        with self._lock:
            if found is None:
                self._show(stream, line)
                return
            rank, text = int(found.group(1)), found.group(2)
            self._keep(rank, text)
            shown = self._visible(rank, text)
            if shown is None:
                return
            self._held.add(rank, stream, shown, self._is_important(rank, shown))
            if len(self._held) > MAX_HELD:
                self._flush(everything=True)
            elif self._timer is None:
                self._start_timer(self._window_s)

    def keep(self, rank: int, lines: list[str]) -> None:
        """Write `lines` to rank `rank`'s file only (its full stacks: `stalls.py`)."""
        with self._lock:
            for line in lines:
                self._keep(rank, line)

    def save_files(self, files: dict[str, bytes]) -> Path:
        """Write `files` beside the rank files (NCCL trace dumps); return the directory."""
        with self._lock:
            if not self._files.made:
                self._files.make()
            for name, data in files.items():
                (self._files.directory / name).write_bytes(data)
            return self._files.directory

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
            copied = self._files.close()
            if copied is not None:
                self._show("stderr", f"[sparkdist] each rank's full output, copied: {copied}")

    # --- under the lock ---------------------------------------------------------------

    def _show(self, stream: str, line: str) -> None:
        out = self._streams[stream] or (sys.stderr if stream == "stderr" else sys.stdout)
        out.write(line + "\n")
        out.flush()

    def _keep(self, rank: int, text: str) -> None:
        """Append the rank's line to its file (its directory named on the first line)."""
        made = self._files.made
        self._files.write(rank, text)
        if not made:
            where = self._files.directory / "rank-N.log"
            self._show("stderr", f"[sparkdist] each rank's full output: {where}")

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

    def _flush(self, everything: bool) -> None:
        """Show the held lines older than the window (or all), oldest first."""
        now = time.monotonic()
        self._files.flush()
        for held in self._held.take(None if everything else now - self._window_s):
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
        ranks, where = spans(list(self._left_out_ranks)), self._files.directory
        self._show(
            "stderr",
            f"[sparkdist] {self._left_out} lines of ranks {ranks} not shown (over "
            f"{self._rate:g} lines a second); every line is in {where}",
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
                oldest = self._held.oldest()
                wait = oldest.since + self._window_s - time.monotonic()
                self._start_timer(max(wait, 0.01))
            elif self._left_out:
                self._start_timer(NOTE_EVERY_S)


class RecordingConsole(Console):
    """Keeps the lines, in order, instead of printing them (a relayed job's task 0
    sends them to the client, which prints them; lines for a rank's file only travel
    as the stream "file")."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[str, str]] = []

    def keep(self, rank: int, lines: list[str]) -> None:
        with self._lock:
            self.lines += [("file", f"[rank {rank}] {line}") for line in lines]

    def write(self, stream: str, line: str) -> None:
        with self._lock:
            self.lines.append((stream, line))
