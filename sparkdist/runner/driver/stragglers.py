"""Stragglers: a rank that steps at least `RATIO` times slower than the median rank.

Each rank's step rate comes from its signs of life that count steps: its data loader's
batches (`Alive`) or its `report()` calls, whichever every measured rank has (batches
first). A rank's rate is its steps over the last `WINDOW_S` seconds; once it has been
`RATIO` times slower than the median for `SUSTAIN_S`, it is named once (host, its rate
against the median), and again when it has kept up for as long. Pure and cheap: the
driver's stall watch (`stalls.StallWatch`) calls `check` once a second.
"""

from __future__ import annotations

import statistics
from collections import deque

WINDOW_S = 5.0
SUSTAIN_S = 3.0
RATIO = 1.5
KINDS = ("batches", "report")
"""The step counts measured, in order of preference."""


class Stragglers:
    """Each rank's step counts over time, and which ranks are named slow."""

    def __init__(self) -> None:
        self._samples: dict[tuple[int, str], deque[tuple[float, int]]] = {}
        self._slow_since: dict[int, float] = {}
        self._even_since: dict[int, float] = {}
        self.slow: dict[int, str] = {}
        """The ranks named slow now, and what was said of each."""
        self.notes: list[str] = []
        """Everything said, in order (`HorovodRunner.last_job.stragglers`)."""

    def progress(self, rank: int, kind: str, count: int, now: float) -> None:
        """Rank `rank` had made `count` steps of `kind` at `now` (seconds)."""
        samples = self._samples.setdefault((rank, kind), deque())
        samples.append((now, count))
        while len(samples) > 2 and samples[1][0] < now - 2 * WINDOW_S:
            samples.popleft()

    def rates(self, now: float) -> dict[int, float]:
        """Steps a second over the last `WINDOW_S`, of each rank measured that long."""
        for kind in KINDS:
            rates = {}
            for (rank, of), samples in self._samples.items():
                if of == kind and samples[0][0] <= now - WINDOW_S:
                    then = max(c for t, c in samples if t <= now - WINDOW_S)
                    rates[rank] = (samples[-1][1] - then) / WINDOW_S
            if len(rates) >= 2:
                return rates
        return {}

    def check(self, now: float, ranks) -> list[str]:
        """What to say now: ranks that became slow, and ranks that recovered."""
        rates = {r: v for r, v in self.rates(now).items() if not _ended(ranks, r)}
        if len(rates) < 2:
            return []
        median = statistics.median(rates.values())
        said = []
        for rank, rate in sorted(rates.items()):
            host = ranks.by_rank[rank].host if rank in ranks.by_rank else "?"
            if median > 0 and rate * RATIO <= median:
                self._even_since.pop(rank, None)
                since = self._slow_since.setdefault(rank, now)
                if rank not in self.slow and now - since >= SUSTAIN_S:
                    self.slow[rank] = (
                        f"rank {rank} (host {host}) is a straggler: {rate:.2f} steps/s against "
                        f"the median {median:.2f} ({_slower(median, rate)})"
                    )
                    said.append(self.slow[rank])
            else:
                self._slow_since.pop(rank, None)
                since = self._even_since.setdefault(rank, now)
                if rank in self.slow and now - since >= SUSTAIN_S:
                    del self.slow[rank]
                    said.append(
                        f"rank {rank} (host {host}) keeps up again: {rate:.2f} steps/s against "
                        f"the median {median:.2f}"
                    )
        self.notes += said
        return said


def _ended(ranks, rank: int) -> bool:
    """A rank that ended steps no more: it is no straggler, nor part of the median."""
    state = ranks.by_rank.get(rank)
    return state is not None and state.exited


def _slower(median: float, rate: float) -> str:
    return f"no step in {WINDOW_S:g}s" if rate <= 0 else f"{median / rate:.1f}x slower"
