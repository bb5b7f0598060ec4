"""Each rank's record on the driver: where it runs, whether it started, its output's
last lines (for error messages), its result or traceback, and how it ended."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from sparkdist.protocol import messages
from sparkdist.runner.driver.console import Console


@dataclass
class RankState:
    rank: int
    host: str = "?"
    started: bool = False
    exit_code: int | None = None
    exited: bool = False
    traceback: str | None = None
    result: bytes | None = None
    has_result: bool = False
    tail: deque = field(default_factory=lambda: deque(maxlen=messages.TAIL_LINES))


class RankRecords:
    """The records of a job's ranks, filled from their messages under the job's lock."""

    def __init__(self, num_ranks: int, cond: threading.Condition, console: Console, log_mode: str):
        self.cond = cond
        self.by_rank = {r: RankState(r) for r in range(num_ranks)}
        self.frameworks: list[str] = []
        """The frameworks rank 0's function used (its `Result` says which)."""
        self._console = console
        self._log_mode = log_mode

    def located(self, rank: int, host: str) -> None:
        """The rank's supervisor connected from `host`."""
        with self.cond:
            self.by_rank[rank].host = host

    def started(self, rank: int, host: str) -> None:
        with self.cond:
            self.by_rank[rank].started = True
            self.by_rank[rank].host = host
            self.cond.notify_all()

    def output(self, rank: int, lines: list[tuple[str, str]]) -> None:
        """Lines the rank printed: kept for error messages, shown with `log_mode="all"`."""
        with self.cond:
            self.by_rank[rank].tail.extend(line for _, line in lines)
        if self._log_mode == "all":
            for stream, line in lines:
                self._console.write(stream, f"[rank {rank}] {line}")

    def result(self, rank: int, value: bytes, frameworks: list[str]) -> None:
        with self.cond:
            self.by_rank[rank].result = value
            self.by_rank[rank].has_result = True
            if rank == 0:
                self.frameworks = frameworks
            self.cond.notify_all()

    def error(self, rank: int, traceback: str) -> None:
        with self.cond:
            self.by_rank[rank].traceback = traceback

    def exited(self, rank: int, exit_code: int, tail: list[str]) -> None:
        """The rank's process ended; `tail` is its last lines as its supervisor saw them."""
        state = self.by_rank[rank]
        with self.cond:
            state.exited = True
            state.exit_code = exit_code
            if tail:
                state.tail.extend(line for line in tail if line not in state.tail)
            self.cond.notify_all()

    def all_started(self) -> bool:
        return all(s.started for s in self.by_rank.values())

    def not_started(self) -> list[int]:
        return [r for r, s in self.by_rank.items() if not s.started]

    def running(self) -> list[int]:
        return [r for r, s in self.by_rank.items() if not s.exited]

    def succeeded(self, needed: Iterable[int], tolerated: set[int]) -> bool:
        """Every rank exited with 0 (or its loss was `tolerated`) and the `needed` ranks
        sent their results."""
        return all(
            s.exited and (s.exit_code == 0 or r in tolerated) for r, s in self.by_rank.items()
        ) and all(self.by_rank[r].has_result for r in needed)

    def tails(self, ranks: list[int]) -> str:
        """The last lines of each of `ranks`, for an error message."""
        parts = []
        for rank in ranks:
            tail = list(self.by_rank[rank].tail)[-10:]
            if tail:
                parts.append(f"\nLast lines of rank {rank}:\n" + "\n".join(f"  {t}" for t in tail))
        return "".join(parts)

    def results(self) -> list[bytes | None]:
        return [self.by_rank[r].result for r in range(len(self.by_rank))]
