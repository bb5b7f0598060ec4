"""The chaos soak's schedule (issue 64, `benchmarks/soak_schedule.py`): the same seed
gives the same faults, a written schedule replays exactly, and over 10,000 draws the
kinds follow the issue's weights, the gaps a Poisson process, and a tenth of the faults
have a second within 5 s."""

from __future__ import annotations

import math
import statistics
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import soak_schedule as schedule  # noqa: E402


def test_a_seed_gives_one_schedule_and_another_seed_another():
    assert schedule.draw(7, 60) == schedule.draw(7, 60)
    assert schedule.draw(7, 60) != schedule.draw(8, 60)
    assert all(f.at_s < 60 * 60 for f in schedule.draw(7, 60))


def test_a_written_schedule_replays_exactly(tmp_path, capsys):
    faults = schedule.draw(3, 120)
    path = tmp_path / "schedule.jsonl"
    assert schedule.main(["--seed", "3", "--minutes", "120", "--out", str(path)]) == 0
    assert schedule.read(path) == faults
    printed = capsys.readouterr().out
    assert schedule.main(["--replay", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == printed.splitlines()[1:]


def test_a_broken_schedule_is_refused_with_its_line(tmp_path):
    path = tmp_path / "schedule.jsonl"
    path.write_text('{"at_s": 1.0, "kind": "sigkill", "duration_s": 0, "pick": 1}\n{"at_s": 2}\n')
    with pytest.raises(ValueError, match=r"schedule.jsonl:2: not a fault"):
        schedule.read(path)
    path.write_text('{"at_s": 1.0, "kind": "meteor", "duration_s": 0, "pick": 1}\n')
    with pytest.raises(ValueError, match="unknown fault kind 'meteor'"):
        schedule.read(path)


def test_ten_thousand_draws_follow_the_weights_the_gaps_and_the_followers():
    gap = 120.0
    faults = []
    seed = 0
    while len(faults) < 10_000:
        faults += schedule.draw(seed, 24 * 60, gap)
        seed += 1
    faults = faults[:10_000]
    counts = Counter(f.kind for f in faults)
    total = sum(weight for weight, _ in schedule.KINDS.values())
    for kind, (weight, span) in schedule.KINDS.items():
        share = weight / total
        sigma = math.sqrt(10_000 * share * (1 - share))
        assert abs(counts[kind] - 10_000 * share) < 4 * sigma, (kind, counts[kind])
        lasting = [f.duration_s for f in faults if f.kind == kind]
        if span is None:
            assert set(lasting) == {0.0}
        else:
            assert span[0] <= min(lasting) and max(lasting) <= span[1]
    firsts = [f for f in faults if not f.follows]
    followers = len(faults) - len(firsts)
    assert abs(followers / len(firsts) - schedule.FOLLOW_SHARE) < 0.015
    for before, fault in zip(faults, faults[1:], strict=False):
        if fault.follows:
            assert 0 <= fault.at_s - before.at_s <= schedule.FOLLOW_WITHIN_S
    one_soak = [f.at_s for f in schedule.draw(11, 10_000 * gap / 60, gap) if not f.follows]
    gaps = [b - a for a, b in zip(one_soak, one_soak[1:], strict=False)]
    assert abs(statistics.mean(gaps) - gap) < 0.05 * gap  # exponential: mean = sd = gap
    assert abs(statistics.stdev(gaps) - gap) < 0.08 * gap


def test_a_fault_picks_its_target_among_the_live_ones():
    fault = schedule.Fault(10.0, "sigkill", 0.0, pick=7)
    assert fault.target([0, 1, 2]) == 1 and fault.target(["a", "b"]) == "b"
    with pytest.raises(ValueError, match="no live target for sigkill"):
        fault.target([])


def test_the_short_soak_has_every_kind_once_and_a_grow_after_the_lost_host():
    faults = schedule.every_kind(64, gap_s=5.0)
    kinds = [f.kind for f in faults]
    assert sorted(kinds) == sorted(schedule.KINDS)
    assert kinds[kinds.index("lose_host") + 1] == "grow"
    assert [f.at_s for f in faults] == [5.0 * (i + 1) for i in range(len(faults))]
    assert faults == schedule.every_kind(64, gap_s=5.0)
    assert kinds != [f.kind for f in schedule.every_kind(65, gap_s=5.0)]
