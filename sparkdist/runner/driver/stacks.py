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

`stopped` decides, from the stacks of an in-process elastic world's members, which ranks
hold the others back (the stall watch then kills them, and the world goes on without
them): a rank whose dump did not come (a stopped process runs no faulthandler), else a
rank in its own code while others wait on their peers (`waits_on_peers`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
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
WAITING = re.compile(
    r"/torch/distributed/|/torch/nn/parallel/|/torch/autograd/|/torch/cuda/|/horovod/"
    r"|/sparkdist/elastic/|/sparkdist/protocol/"
)
"""Where a rank waits on its peers: a collective (torch.distributed's gloo or NCCL, DDP's
in backward, Horovod's), the device (NCCL's work), or the driver (its next world)."""
STANDARD = re.compile(r"^<frozen |/lib/python3\.\d+/(?!site-packages/|dist-packages/)")
"""The standard library: a wait there (a lock, a queue) is its caller's."""
NO_STACKS = "its stacks could not be taken: the process does not run (stopped?)"


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
    main = main_thread(threads)
    others: dict[str, int] = {}  # the same line from several threads shows once
    for thread in threads:
        if thread is not main and any(not frame.library for frame in thread):
            line = describe(thread)
            others[line] = others.get(line, 0) + 1
    shown = [f"{n} threads: {line}" if n > 1 else f"thread: {line}" for line, n in others.items()]
    return (describe(main), *shown)


def main_thread(threads: list[list[Frame]]) -> list[Frame]:
    """The rank's main thread (the one in `RANK_MAIN`; else the dump's last)."""
    return next((t for t in threads if any(f.file.endswith(RANK_MAIN) for f in t)), threads[-1])


def waits_on_peers(text: str) -> bool:
    """Whether the rank of dump `text` waits on its peers: its main thread's innermost
    frame outside the standard library is in `WAITING` (else it is in its own code)."""
    threads = parse(text)
    if not threads:
        return False
    frame = next((f for f in main_thread(threads) if not STANDARD.search(f.file)), None)
    return frame is not None and WAITING.search(frame.file) is not None


def stopped(stacks: Mapping[int, RankStacks], members: Iterable[int]) -> dict[int, str]:
    """The `members` that hold the others back, and why; {} when none can be singled out.

    Members whose dump has no Python stack did not answer: a process that does not run (a
    SIGSTOPped one runs no faulthandler). They are the ones, as long as another member
    answered. When every member answered: those in their own code while at least one other
    waits on its peers (`waits_on_peers`). Every member alike (all silent, all waiting, all
    in their own code): none."""
    members = [rank for rank in members if rank in stacks]
    silent = [rank for rank in members if not parse(stacks[rank].text)]
    if len(silent) == len(members):
        return {}
    if silent:
        return dict.fromkeys(silent, NO_STACKS)
    waiting = [rank for rank in members if waits_on_peers(stacks[rank].text)]
    busy = [rank for rank in members if rank not in waiting]
    if not waiting or not busy:
        return {}
    others = f"rank {waiting[0]} waits" if len(waiting) == 1 else f"ranks {spans(waiting)} wait"
    return {
        rank: f"it is in its own code ({summary(stacks[rank].text)[0]}) while {others} in a "
        "collective"
        for rank in busy
    }


def group(stacks: Mapping[int, RankStacks], wait_s: float) -> list[str]:
    """One entry per distinct summary, ranks in order: `ranks 0,2 (hosts a, c): ...`
    (a rank that did not answer within `wait_s` says so)."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for rank in sorted(stacks):
        lines = summary(stacks[rank].text)
        if not lines:
            lines = (
                f"(no stacks within {wait_s:g} s: the rank ended, stopped, or blocks the signal)",
            )
        groups.setdefault(lines, []).append(rank)
    entries = []
    for lines, ranks in sorted(groups.items(), key=lambda item: item[1][0]):
        hosts = list(dict.fromkeys(stacks[rank].host for rank in ranks))
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {spans(ranks)}"
        where = f"host {hosts[0]}" if len(hosts) == 1 else f"hosts {', '.join(hosts)}"
        entries.append(f"{who} ({where}): {lines[0]}")
        entries += [f"    {line}" for line in lines[1:]]
    return entries
