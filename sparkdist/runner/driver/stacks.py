"""Where each rank is, readably: faulthandler dumps grouped by stack.

A rank's dump (`protocol/stack_dumps.py`) lists every thread's Python frames, most
recent first. This module reduces it to one line per thread that matters: the user's
frames, innermost first, after the name of the library function they are blocked in
(`all_reduce <- step (train.py:42) <- main (train.py:60)`); frames of sparkdist, torch
and other installed packages, and of the standard library, are folded. The rank's main
thread always shows; another thread shows when it runs user code (a data loader's
reader). Ranks whose lines are the same show once, as the console collapses identical
lines: `ranks 0,2 (hosts a, c): ...`. Pure functions: the driver's stall watch
(`stalls.py`) asks the ranks and prints what these return.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

from sparkdist.runner.driver.console import spans

USER_FRAMES = 5
"""At most this many of a thread's user frames show (the innermost)."""
THREAD_START = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ .*:\s*$")
FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<function>.+)$')
LIBRARY = re.compile(
    r"site-packages|dist-packages|^<frozen |/lib/python3\.\d+/"
    r"|/sparkdist/(runner|protocol|data|elastic|checkpoint|backends|tracking|tune|spark)/"
    r"|/sparkdist/[a-z_]+\.py$"
)
"""Where a frame is not the user's: an installed package, the standard library, sparkdist."""
RANK_MAIN = "sparkdist/runner/rank/main.py"
"""A frame of this file marks a rank's main thread."""


class Frame(NamedTuple):
    file: str
    line: int
    function: str

    @property
    def library(self) -> bool:
        return LIBRARY.search(self.file) is not None

    def short(self) -> str:
        return f"{self.function} ({self.file.rsplit('/', 1)[-1]}:{self.line})"


class RankStacks(NamedTuple):
    """One rank's answer: its host and its dump ("" when it gave none)."""

    host: str
    text: str


def parse(text: str) -> list[list[Frame]]:
    """Each thread's frames, most recent first, in the dump's order."""
    threads: list[list[Frame]] = []
    for line in text.splitlines():
        if THREAD_START.match(line):
            threads.append([])
            continue
        found = FRAME.match(line)
        if found and threads:
            threads[-1].append(Frame(found["file"], int(found["line"]), found["function"]))
    return threads


def describe(frames: list[Frame]) -> str:
    """A thread in one line: the library function it is in, then its user frames."""
    user = [frame for frame in frames if not frame.library]
    if not user:
        return frames[0].short() if frames else "(no Python frames)"
    parts = [frames[0].function] if frames[0].library else []
    parts += [frame.short() for frame in user[:USER_FRAMES]]
    return " <- ".join(parts)


def summary(text: str) -> tuple[str, ...]:
    """A rank's lines: its main thread's, then each other thread running user code."""
    threads = parse(text)
    if not threads:
        return ()
    main = next((t for t in threads if any(f.file.endswith(RANK_MAIN) for f in t)), threads[-1])
    others: dict[str, int] = {}  # the same line from several threads shows once
    for thread in threads:
        if thread is not main and any(not frame.library for frame in thread):
            line = describe(thread)
            others[line] = others.get(line, 0) + 1
    shown = [f"{n} threads: {line}" if n > 1 else f"thread: {line}" for line, n in others.items()]
    return (describe(main), *shown)


def group(stacks: Mapping[int, RankStacks], wait_s: float) -> list[str]:
    """One entry per distinct summary, ranks in order: `ranks 0,2 (hosts a, c): ...`
    (a rank that did not answer within `wait_s` says so)."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for rank in sorted(stacks):
        lines = summary(stacks[rank].text)
        if not lines:
            lines = (f"(no stacks within {wait_s:g} s: the rank ended, or blocks the signal)",)
        groups.setdefault(lines, []).append(rank)
    entries = []
    for lines, ranks in sorted(groups.items(), key=lambda item: item[1][0]):
        hosts = list(dict.fromkeys(stacks[rank].host for rank in ranks))
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {spans(ranks)}"
        where = f"host {hosts[0]}" if len(hosts) == 1 else f"hosts {', '.join(hosts)}"
        entries.append(f"{who} ({where}): {lines[0]}")
        entries += [f"    {line}" for line in lines[1:]]
    return entries
