"""The chaos soak's invariants (issue 64, `benchmarks/soak_checks.py`) on made-up step
records: a step written again after a world went back to its commit replaces the first,
each redone step is charged to the fault before it, and an epoch with a row twice or a
row missing fails."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import soak_checks as checks  # noqa: E402
import soak_faults  # noqa: E402

ROWS, BATCH = 8, 4  # two steps an epoch


def step(number: int, at: float, epoch: int, ids: list[int], generation: int = 0) -> dict:
    return {"step": number, "at": at, "epoch": epoch, "ids": ids, "generation": generation}


def fired(at: float, kind: str = "sigkill") -> SimpleNamespace:
    return SimpleNamespace(
        at=at, skipped="", fault=SimpleNamespace(kind=kind), generation=0, attempt=0
    )


STEPS = [
    step(1, 1.0, 0, [0, 1, 2, 3]),
    step(2, 2.0, 0, [4, 5, 6, 7]),
    step(3, 3.0, 1, [7, 6, 5, 4]),  # its commit broke: redone below
    step(3, 5.0, 1, [7, 6, 5, 4], generation=1),
    step(4, 6.0, 1, [3, 2, 1, 0], generation=1),
]


def test_a_redone_step_replaces_the_first_and_is_charged_to_the_fault_before_it():
    kept, redone = checks.committed(STEPS)
    assert [r["step"] for r in kept] == [1, 2, 3, 4] and kept[2]["at"] == 5.0
    assert [r["at"] for r in redone] == [5.0]
    assert checks.check_steps(STEPS, 4, [fired(3.5)], per_fault=1)[0]
    assert not checks.check_steps(STEPS, 4, [], per_fault=1)[0]  # no fault to charge it to
    assert not checks.check_steps(STEPS, 5, [fired(3.5)], per_fault=1)[0]  # target missed
    twice = [*STEPS, step(4, 7.0, 1, [3, 2, 1, 0], generation=2)]
    assert not checks.check_steps(twice, 4, [fired(3.5)], per_fault=1)[0]


def test_every_row_once_an_epoch_at_the_global_batch():
    assert checks.check_rows(STEPS, ROWS, BATCH)[0]
    missing = [*STEPS[:4], step(4, 6.0, 1, [3, 2, 1, 1])]
    ok, why = checks.check_rows(missing, ROWS, BATCH)
    assert not ok and "read twice" in why
    short = [*STEPS[:4], step(4, 6.0, 1, [3, 2, 1])]
    ok, why = checks.check_rows(short, ROWS, BATCH)
    assert not ok and "global batch" in why


def test_recovery_is_timed_to_the_first_step_of_a_world_formed_after_the_fault():
    assert checks.recovery_s(fired(3.5), None, STEPS) == 1.5
    assert checks.percentile([1.0, 2.0, 3.0, 10.0], 0.5) == 2.0
    assert checks.percentile([1.0, 2.0, 3.0, 10.0], 0.99) == 10.0


def test_a_fault_that_changes_no_world_is_timed_to_the_next_step_not_to_its_end():
    """A slow rank lasting 60 s: the job steps on through it (the 30-minute soak's table
    said 60.2 s when this was timed from the fault's end)."""
    slow = SimpleNamespace(**{**vars(fired(5.5, "slow_rank")), "generation": 1}, ended_at=65.5)
    assert checks.recovery_s(slow, None, STEPS) == 0.5


def test_each_step_reads_the_control_s_rows():
    assert checks.check_same_rows(STEPS, STEPS[:2] + STEPS[3:])[0]
    other = [*STEPS[:4], step(4, 6.0, 1, [0, 1, 2, 7])]
    ok, why = checks.check_same_rows(other, STEPS)
    assert not ok and "[4]" in why


def test_a_relaunched_world_s_first_step_times_the_fault_even_when_a_later_one_redid_it():
    """Relaunch mode: the world of generation 1 stepped 3 after the fault at 2.5; the fault
    at 3.5 sent the job back to its checkpoint (step 2), so that step was redone."""
    relaunched = [*STEPS[:2], step(3, 3.0, 1, [7, 6, 5, 4], generation=1)]
    relaunched += [step(3, 5.0, 1, [7, 6, 5, 4], generation=2)]
    assert checks.recovery_s(fired(2.5), fired(3.5), relaunched) == 0.5


def test_relaunch_checkpoints_are_saved_once_each_in_order():
    saved = [{"step": 5, "at": 1.0}, {"step": 10, "at": 2.0}, {"step": 12, "at": 3.0}]
    assert checks.check_saved(saved, 12)[0]
    again = [*saved, {"step": 10, "at": 4.0}]  # resumed from an older one and saved again
    ok, why = checks.check_saved(again, 12)
    assert not ok and "(12, 10)" in why
    assert not checks.check_saved(saved, 11)[0]  # beyond where the job stopped


def test_the_time_that_trained_nothing_is_charged_to_each_fault_less_one_step():
    """STEPS at one step a second: 5 s from the first kept step to the last for 3 steps
    after it, 2 s lost. The sigkill at 3.5 s is recovered at 5.0 s, 0.5 s more than the
    step due then anyway; the other 1.5 s (step 3 done at 3.0 s, thrown away, done again)
    the faults do not explain."""
    text, kinds = checks.table([fired(3.5)], STEPS, job_ok=True, step_s=1.0)
    assert kinds["sigkill"]["lost_s"] == 0.5 and "lost s" in text.splitlines()[0]
    lost = checks.time_lost(kinds, STEPS, step_s=1.0)
    assert lost == {"lost_s": 2.0, "sigkill": 0.5, "unexplained_s": 1.5}


RELAUNCHED = [
    step(1, 1.0, 0, [0, 1, 2, 3], generation=2),
    step(2, 2.0, 0, [4, 5, 6, 7], generation=2),
    step(3, 3.0, 1, [7, 6, 5, 4], generation=2),
    # a follower took the world below min_np: attempt 1 resumed from the checkpoint at 1
    {**step(2, 9.0, 0, [4, 5, 6, 7]), "attempt": 1},
    {**step(3, 10.0, 1, [7, 6, 5, 4]), "attempt": 1},
    {**step(4, 11.0, 1, [3, 2, 1, 0]), "attempt": 1},
]


def test_a_relaunch_in_process_may_redo_what_no_checkpoint_held_and_is_timed_to_its_world():
    """An in-process world left below min_np relaunches from its last disk checkpoint: the
    steps since are redone once, not once a fault; the fault's recovery is timed to the new
    attempt's first step (its generation 0 is newer than the old attempt's generation 2)."""
    kill = fired(3.5)
    kill.generation = 2
    assert checks.relaunched_after(RELAUNCHED, [kill]) == {0}
    saved = [{"step": 1, "at": 1.5}]
    ok, why = checks.check_steps(RELAUNCHED, 4, [kill], per_fault=1, saved=saved)
    assert ok, why
    newer = [*saved, {"step": 2, "at": 2.5}]  # attempt 1 should have resumed after step 2
    ok, why = checks.check_steps(RELAUNCHED, 4, [kill], per_fault=1, saved=newer)
    assert not ok and "before the newest checkpoint" in why
    assert checks.recovery_s(kill, None, RELAUNCHED) == 5.5


def relaunch_steps(last: int, resumed_at: int, target: int) -> list[dict]:
    """Attempt 0 steps 1..last, one a second; attempt 1 from `resumed_at` to `target`."""
    rows = [{**step(n, float(n), 0, [0]), "attempt": 0} for n in range(1, last + 1)]
    later = range(resumed_at, target + 1)
    return rows + [{**step(n, 100.0 + n, 0, [0]), "attempt": 1} for n in later]


def test_a_relaunch_after_a_failed_save_may_redo_more_than_a_checkpoint_interval():
    """The 30-minute relaunch soak (seed 7) charged a cut host 6 redone steps against a
    checkpoint interval of 5: its disk_full fault had failed a save 20 s before. A relaunch
    redoes the steps since the newest checkpoint saved, whatever the interval, and resuming
    from an older one than that fails."""
    steps = relaunch_steps(last=13, resumed_at=6, target=15)  # checkpoint 10 never saved
    saved = [{"step": 5, "at": 5.1}]
    cut = fired(13.5, "cut_host")
    ok, why = checks.check_steps(steps, 15, [cut], per_fault=5, saved=saved)
    assert ok, why
    assert "8 redone" in why
    ten = [*saved, {"step": 10, "at": 10.1}]  # had 10 been saved, 6 resumed too early
    ok, why = checks.check_steps(steps, 15, [cut], per_fault=5, saved=ten)
    assert not ok and "(106.0, 6, 10)" in why
    ok, why = checks.check_steps(relaunch_steps(13, 11, 15), 15, [cut], per_fault=5, saved=ten)
    assert ok, why
    assert checks.relaunches(steps, saved) == [(106.0, 6, 5, 13)]


def test_a_rank_is_its_pid_and_start_time_so_a_reused_pid_is_never_signalled():
    """The 60-minute soak SIGKILLed a pid a stopped rank had had 25 minutes before (pid_max
    32768): a rank is known by its pid and its process's start time, as it logged them."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        member = {"pid": child.pid, "started": psutil.Process(child.pid).create_time()}
        assert soak_faults.alive(member)
        other = {**member, "started": member["started"] - 60.0}  # the pid's earlier owner
        assert not soak_faults.alive(other)
        soak_faults._signal(other, signal.SIGKILL)
        assert child.poll() is None and soak_faults.alive(member)
        soak_faults._signal(member, signal.SIGKILL)
        assert child.wait(timeout=10) == -signal.SIGKILL
        assert not soak_faults.alive(member)
    finally:
        child.kill()
        child.wait()
