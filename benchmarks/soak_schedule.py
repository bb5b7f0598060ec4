"""The chaos soak's schedule of faults (issue 64): seeded, printed, replayable.

Faults come at random times, a Poisson process of `mean_gap_s` (one every two minutes by
default), each of a kind drawn by the issue's weights. In `FOLLOW_SHARE` of the cases a
second fault follows within `FOLLOW_WITHIN_S`, to hit a recovery in progress. A fault
names its target by a number (`pick`), mapped onto whatever ranks or hosts are alive
when it fires (`Fault.target`), so the same seed against the same world injects the
same faults. The schedule is written as JSON lines; `--replay FILE` reads one back.

    python benchmarks/soak_schedule.py --seed 7 --minutes 30       # print a schedule
    python benchmarks/soak_schedule.py --replay schedule.jsonl     # print a logged one
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

KINDS: dict[str, tuple[int, tuple[float, float] | None]] = {
    # kind: (weight, how long it lasts in seconds (low, high); None: it is an instant)
    "sigkill": (25, None),  # SIGKILL a rank
    "sigstop": (10, (30.0, 120.0)),  # a frozen process, SIGCONT after
    "stuck": (5, (30.0, 120.0)),  # a rank stuck in user code on a lock
    "cut_host": (15, (20.0, 90.0)),  # a host cut off the network, then back
    "lose_host": (10, None),  # a host's executor and ranks lost (it comes back later)
    "notice": (10, None),  # a decommission notice
    "exit": (5, None),  # a rank that segfaults or calls os._exit
    "slow_rank": (5, (60.0, 60.0)),  # one rank 3x slower
    "in_checkpoint": (5, None),  # a fault while a checkpoint is being written
    "disk_full": (5, (30.0, 30.0)),  # the checkpoint store's disk full
    "grow": (5, None),  # a host comes back
}
MEAN_GAP_S = 120.0
FOLLOW_SHARE = 0.10
FOLLOW_WITHIN_S = 5.0


@dataclass(frozen=True)
class Fault:
    at_s: float
    """Seconds after the soak's start."""
    kind: str
    duration_s: float
    """0 for an instant fault."""
    pick: int
    """Which target: `target` maps it onto the live ones when the fault fires."""
    follows: bool = False
    """A second fault within `FOLLOW_WITHIN_S` of the one before."""

    def target(self, live: list) -> object:
        """The rank or host this fault hits among `live` (in a stable order)."""
        if not live:
            raise ValueError(f"no live target for {self.kind} at {self.at_s:.1f}s")
        return live[self.pick % len(live)]


def draw(seed: int, minutes: float, mean_gap_s: float = MEAN_GAP_S) -> list[Fault]:
    """The faults of a soak of `minutes`, from `seed` alone."""
    rng = random.Random(seed)
    kinds, weights = list(KINDS), [weight for weight, _ in KINDS.values()]
    faults: list[Fault] = []
    at = rng.expovariate(1.0 / mean_gap_s)
    while at < minutes * 60.0:
        faults.append(_fault(rng, at, rng.choices(kinds, weights)[0], follows=False))
        if rng.random() < FOLLOW_SHARE:
            second = at + rng.uniform(0.0, FOLLOW_WITHIN_S)
            faults.append(_fault(rng, second, rng.choices(kinds, weights)[0], follows=True))
        at += rng.expovariate(1.0 / mean_gap_s)
    return faults


def every_kind(seed: int, gap_s: float, only: tuple[str, ...] = ()) -> list[Fault]:
    """Each kind (of `only`, if given) once, in an order drawn from `seed`, `gap_s` apart
    (the cluster tests' short soaks); the grow comes right after the lost host, which it
    brings back."""
    rng = random.Random(seed)
    kinds = [kind for kind in KINDS if kind != "grow" and (not only or kind in only)]
    rng.shuffle(kinds)
    if "grow" in (only or KINDS):
        kinds.insert(kinds.index("lose_host") + 1, "grow")
    return [_fault(rng, gap_s * (i + 1), kind, follows=False) for i, kind in enumerate(kinds)]


def _fault(rng: random.Random, at: float, kind: str, follows: bool) -> Fault:
    span = KINDS[kind][1]
    duration = 0.0 if span is None else round(rng.uniform(*span), 1)
    return Fault(round(at, 1), kind, duration, rng.randrange(1 << 30), follows)


def write(faults: list[Fault], path: Path) -> None:
    path.write_text("".join(json.dumps(asdict(f), sort_keys=True) + "\n" for f in faults))


def read(path: Path) -> list[Fault]:
    """A schedule written by `write`; refuses a line that is no fault, saying which."""
    faults = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            fault = Fault(**json.loads(line))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{number}: not a fault of a soak schedule: {exc}") from None
        if fault.kind not in KINDS:
            raise ValueError(f"{path}:{number}: unknown fault kind {fault.kind!r}")
        faults.append(fault)
    return faults


def describe(faults: list[Fault]) -> str:
    lines = [f"{len(faults)} faults:"]
    for fault in faults:
        lasts = f" for {fault.duration_s:.0f}s" if fault.duration_s else ""
        after = " (follows the last)" if fault.follows else ""
        lines.append(f"  {fault.at_s:8.1f}s  {fault.kind}{lasts}, target #{fault.pick}{after}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--mean-gap", type=float, default=MEAN_GAP_S, metavar="S")
    parser.add_argument("--replay", type=Path, help="print a schedule written before")
    parser.add_argument("--out", type=Path, help="write the schedule here (JSON lines)")
    args = parser.parse_args(argv)
    faults = read(args.replay) if args.replay else draw(args.seed, args.minutes, args.mean_gap)
    if args.out:
        write(faults, args.out)
    source = f"replayed from {args.replay}" if args.replay else f"seed {args.seed}"
    print(f"soak schedule ({source}, {args.minutes:g} minutes):")
    print(describe(faults))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
