"""A stopped rank in an in-process elastic world is a lost rank (issue 64): when no rank
showed a sign of life for `stall_timeout`, the stall watch takes every rank's stacks, names
the members that hold the others back (one whose stacks did not come: a SIGSTOPped
process runs no faulthandler; one in its own code while the others wait in a collective),
kills them through their supervisors, and the world re-forms without them in process.

* the decision itself, on dumps as faulthandler writes them (`stacks.stopped`);
* on real Spark (local-cluster, the session's; two ranks per task, a world of four in
  `sparkdist.elastic.run` with torch's gloo): launch rank 3 SIGSTOPs itself at step 5,
  or blocks on a lock in its own code there, while the others wait in `all_reduce`. The
  job ends with the three others; its log and rank 3's log say why; nothing is left.

`SPARKDIST_ELASTIC_TIMEOUT_S` is longer than the test, so that the stall watch, not gloo's
timeout, ends the blocked collective. The ranks print a line a second until training
starts (importing torch takes seconds, in silence, on a loaded machine): the short
`stall_timeout` counts from the stall.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import stall_jobs
from helpers import assert_nothing_left

import sparkdist
from sparkdist import job_environment
from sparkdist.protocol import stack_dumps
from sparkdist.runner.driver import stacks
from sparkdist.runner.driver.job_spec import RunnerOptions
from sparkdist.runner.driver.stacks import NO_STACKS, RankStacks
from sparkdist.runner.driver.stalls import (
    ELASTIC_STALL_TIMEOUT_S,
    SignsOfLife,
    StallClock,
    StallWatch,
    relook_s,
)

ENV = {"SPARKDIST_ELASTIC_TIMEOUT_S": "300"}
STALL_TIMEOUT_S = 8
STOP_AT = 5
STEPS = 30

# --- the decision ----------------------------------------------------------------------

SITE = "/venv/lib/python3.11/site-packages"
RANK_MAIN = (
    'File "/work/job/train.py", line 60 in train',
    'File "/opt/sparkdist/elastic/run.py", line 131 in _enter',
    'File "/opt/sparkdist/elastic/run.py", line 86 in run',
    'File "/opt/sparkdist/runner/rank/main.py", line 80 in main',
    'File "<frozen runpy>", line 88 in _run_code',
)
BEAT = textwrap.dedent(
    """\
    Thread 0x00007f0000000001 (most recent call first):
      File "/usr/lib/python3.11/threading.py", line 331 in wait
      File "/opt/sparkdist/elastic/generations.py", line 120 in _run
      File "/usr/lib/python3.11/threading.py", line 1045 in _bootstrap_inner

    """
)


def dump(*innermost: str) -> str:
    """A rank's dump: a watcher thread, then its main thread, whose innermost frames are
    `innermost` (faulthandler's lines) above the training function."""
    frames = "".join(f"  {line}\n" for line in (*innermost, *RANK_MAIN))
    return f"{BEAT}Current thread 0x00007f0000000002 (most recent call first):\n{frames}"


IN_ALL_REDUCE = dump(
    f'File "{SITE}/torch/distributed/distributed_c10d.py", line 2950 in all_reduce',
    f'File "{SITE}/torch/distributed/c10d_logger.py", line 81 in wrapper',
)
ON_A_LOCK = dump('File "/work/job/stall_jobs.py", line 17 in stuck')
IN_BACKWARD = dump(  # DDP's reducer all-reduces the gradients inside backward
    f'File "{SITE}/torch/autograd/graph.py", line 825 in _engine_run_backward',
    f'File "{SITE}/torch/autograd/__init__.py", line 347 in backward',
    f'File "{SITE}/torch/_tensor.py", line 581 in backward',
)
WAITING_FOR_A_WORLD = dump(  # gloo timed out: back to the last commit, waiting for a world
    'File "/usr/lib/python3.11/ssl.py", line 1134 in read',
    'File "/opt/sparkdist/protocol/wire.py", line 200 in recv',
    'File "/opt/sparkdist/protocol/driver_channel.py", line 38 in request',
    'File "/opt/sparkdist/elastic/generations.py", line 78 in _ask',
)
WAITING_FOR_A_BATCH = dump(  # its reader thread runs the user's transform, which hangs
    'File "/usr/lib/python3.11/threading.py", line 331 in wait',
    'File "/usr/lib/python3.11/queue.py", line 171 in get',
    'File "/opt/sparkdist/data/loader.py", line 90 in __iter__',
)
PY_SPY_ONLY = (  # py-spy read a stopped process's memory; faulthandler gave nothing
    "\nstacks read by py-spy (py-spy dump --nonblocking --pid 42):\n"
    'Thread 0x7F0000000002 (idle): "MainThread"\n'
    "    all_reduce (torch/distributed/distributed_c10d.py:2950)\n"
)


def answers(**texts: str) -> dict[int, RankStacks]:
    return {int(name[1:]): RankStacks("10.0.0.7", text) for name, text in texts.items()}


def test_a_member_whose_stacks_did_not_come_is_the_one_that_stopped():
    world = answers(r0=IN_ALL_REDUCE, r1=IN_ALL_REDUCE, r2=IN_ALL_REDUCE, r3="")
    assert stacks.stopped(world, [0, 1, 2, 3]) == {3: NO_STACKS}
    # py-spy's stacks of a stopped process are no answer of its own
    world[3] = RankStacks("10.0.0.7", PY_SPY_ONLY)
    assert stacks.stopped(world, [0, 1, 2, 3]) == {3: NO_STACKS}
    # whatever the others do: they answered, it did not
    assert stacks.stopped(answers(r0=ON_A_LOCK, r1=""), [0, 1]) == {1: NO_STACKS}


def test_a_member_in_its_own_code_while_the_others_wait_in_a_collective_is_the_one():
    world = answers(r0=IN_ALL_REDUCE, r1=IN_ALL_REDUCE, r2=IN_ALL_REDUCE, r3=ON_A_LOCK)
    found = stacks.stopped(world, [0, 1, 2, 3])
    assert list(found) == [3]
    assert "its own code (stuck (stall_jobs.py:17) <- train (train.py:60))" in found[3]
    assert "while ranks 0-2 wait in a collective" in found[3]
    # waiting in DDP's backward, or for the driver's next world, is waiting on the peers
    world = answers(r0=IN_BACKWARD, r1=WAITING_FOR_A_WORLD, r2=ON_A_LOCK)
    assert list(stacks.stopped(world, [0, 1, 2])) == [2]
    # a main thread that waits for its own reader thread is in its own code
    world = answers(r0=IN_ALL_REDUCE, r1=WAITING_FOR_A_BATCH)
    found = stacks.stopped(world, [0, 1])
    assert list(found) == [1] and "while rank 0 waits in a collective" in found[1]


def test_members_alike_single_out_nobody():
    assert stacks.stopped(answers(r0=IN_ALL_REDUCE, r1=IN_BACKWARD), [0, 1]) == {}
    assert stacks.stopped(answers(r0=ON_A_LOCK, r1=WAITING_FOR_A_BATCH), [0, 1]) == {}
    assert stacks.stopped(answers(r0="", r1=""), [0, 1]) == {}
    assert stacks.stopped({}, [0, 1]) == {}


def test_only_members_are_singled_out():
    """A rank that is not a member (a newcomer not yet in a world, one that left) is
    neither dropped nor counted."""
    world = answers(r0=IN_ALL_REDUCE, r1=IN_ALL_REDUCE, r4="", r5=ON_A_LOCK)
    assert stacks.stopped(world, [0, 1]) == {}
    assert list(stacks.stopped(world, [0, 1, 5])) == [5]


def test_an_in_process_elastic_world_has_a_stall_timeout_by_default():
    """60 s unless given, for an in-process elastic world only (`min_np` set on its
    membership: the direct launcher); it drops stopped ranks, and fails no job itself."""

    def watch(min_np: int | None, **given) -> StallWatch:
        state = SimpleNamespace(membership=SimpleNamespace(min_np=min_np))
        options = RunnerOptions(np=4, min_np=2, max_np=4, **given)
        return StallWatch(state, options, "job", print)

    elastic = watch(2)
    assert elastic.timeout_s == ELASTIC_STALL_TIMEOUT_S == 60 and elastic.default
    assert RunnerOptions(np=4, min_np=2, max_np=4).stall_timeout is None  # not given
    given = watch(2, stall_timeout=60)
    assert given.timeout_s == 60 and not given.default
    fixed = watch(None)  # a fixed-size world, or the mpi launcher's
    assert fixed.timeout_s is None and not fixed.default


def test_a_look_that_singles_nobody_out_keeps_each_silence_and_holds_the_next_look_back():
    """Silence counts from each member's own last sign of life, not from the last look;
    only a drop (the world re-forms) counts anew. The next look waits `relook_s`: a
    quarter of `stall_timeout`, at least 3 s."""
    assert relook_s(ELASTIC_STALL_TIMEOUT_S) == 15 and relook_s(10) == relook_s(8) == 3
    clock, life = StallClock(start_timeout=60), SignsOfLife()
    life.by_rank = {0: clock.since + 1.0, 1: clock.since + 5.0}
    now = clock.since + 12.0
    assert clock.silences(life, [0, 1], now) == pytest.approx({0: 11.0, 1: 7.0})
    looked = time.monotonic()
    clock.look_later(relook_s(10))
    assert not clock.may_look(looked) and clock.may_look(time.monotonic() + 3.0)
    assert clock.silences(life, [0, 1], now) == pytest.approx({0: 11.0, 1: 7.0})
    clock.restart()  # a drop: the survivors' silence counts from here
    life.by_rank = {0: clock.since - 5.0, 1: clock.since - 1.0}  # they spoke before it
    assert clock.silences(life, [0, 1], clock.since + 2.0) == pytest.approx({0: 2.0, 1: 2.0})


def records_of(started: list[int]) -> SimpleNamespace:
    """A `RankRecords` as the stall watch reads it: the ranks that started."""
    return SimpleNamespace(
        by_rank={r: SimpleNamespace(started=True, exited=False) for r in started}
    )


def test_a_first_rank_starting_shields_every_member():
    """The world's first ranks start together, and the early ones wait in the first
    collective for the late ones: while one of them starts, every member is shielded."""
    clock, life = StallClock(start_timeout=60), SignsOfLife()
    t0 = clock.since
    clock.note(records_of([0, 1, 2]), [0, 1, 2], t0)
    life.by_rank = {0: t0 + 1.0, 1: t0 + 2.0}  # rank 2 still imports
    assert clock.shielded(life, [0, 1, 2], t0 + 40.0) == {0, 1, 2}
    assert clock.shielded(life, [0, 1, 2], t0 + 61.0) == set()  # past start_timeout


def test_a_starting_newcomer_shields_only_the_members_that_spoke_since_it_joined():
    """Issue 64's soak: member 1 got stuck in its own code; then newcomer 3 joined the world
    and imported torch in silence while members 0 and 2 (who spoke since) wait for it.
    Member 1 is not shielded by it: silent since before it joined, it cannot be waiting
    for it. Once the newcomer speaks, it shields nobody."""
    clock, life = StallClock(start_timeout=60), SignsOfLife()
    t0 = clock.since
    clock.note(records_of([0, 1, 2]), [0, 1, 2], t0)
    life.by_rank = {0: t0 + 4.0, 1: t0 + 5.0, 2: t0 + 4.0}
    clock.note(records_of([0, 1, 2, 3]), [0, 1, 2, 3], t0 + 6.0)  # it joins
    life.by_rank.update({0: t0 + 7.0, 2: t0 + 8.0})  # they go on to its world, and wait
    members, now = [0, 1, 2, 3], t0 + 30.0
    assert clock.starting(life, members, now) == [3]
    assert clock.shielded(life, members, now) == {0, 2, 3}
    life.by_rank[3] = t0 + 31.0
    assert clock.shielded(life, members, t0 + 32.0) == set()


def watched_world(members: list[int]) -> StallWatch:
    """A stall watch (not started) over an in-process elastic world of `members`."""
    records = records_of(members)
    membership = SimpleNamespace(min_np=2, survivors=lambda: list(members))
    state = SimpleNamespace(cond=threading.Condition(), rank_records=records, membership=membership)
    state.life = SignsOfLife()
    options = RunnerOptions(np=len(members), min_np=2, max_np=4, stall_timeout=20)
    return StallWatch(state, options, "job", print)


def test_a_member_stuck_before_a_newcomer_joined_is_due_while_the_newcomer_starts():
    """`stall_timeout` 20: member 1 went silent at 1 s, newcomer 3 joined at 2 s and still
    imports at 21.5 s. Member 1 is due then, 20.5 s after its last sign of life (before
    the fix: nothing was due until the newcomer spoke); the job is not stalled."""
    watch = watched_world([0, 1, 2])
    life, t0 = watch.state.life, watch._clock.since
    watch._due(t0)  # the first ranks noted
    life.by_rank = {0: t0 + 1.0, 1: t0 + 1.0, 2: t0 + 1.0}
    life.last = t0 + 1.0
    watch.state.rank_records = records_of([0, 1, 2, 3])
    watch.state.membership.survivors = lambda: [0, 1, 2, 3]
    assert watch._due(t0 + 2.0) is None  # newcomer 3 joins
    life.by_rank.update({0: t0 + 3.0, 2: t0 + 3.0})  # they go on to its world, and wait
    life.last = t0 + 3.0
    assert watch._due(t0 + 20.5) is None
    due = watch._due(t0 + 21.5)
    assert due is not None, "member 1 was shielded by the newcomer's start"
    stalled, silent = due
    assert not stalled and silent == pytest.approx({1: 20.5})
    assert watch._due(t0 + 30.0)[1].keys() == {1}  # 0 and 2 wait for the newcomer


# --- on real Spark -------------------------------------------------------------------------


def stop_one_rank(out: str, how: str, stop_rank: int = 3, others_work: bool = False) -> dict:
    """Steps of a gloo `all_reduce` and a commit inside `sparkdist.elastic.run`; at step
    `STOP_AT` launch rank `stop_rank` stops: SIGSTOPs itself (`how="sigstop"`) or blocks on
    a lock in its own code (`how="lock"`, until `out/lock` is removed), so that the others
    wait in `all_reduce`. With `others_work`, the others first stay in their own code, a
    line a second (not a stalled job), until the stall watch has taken their stacks (their
    stacks file grew: that look found every member in its own code). Each member returns
    its world's size and its last step."""
    started = threading.Event()
    threading.Thread(target=stall_jobs._beat_until, args=(started,), daemon=True).start()
    import torch
    import torch.distributed as dist

    from sparkdist import elastic

    launch_rank = int(os.environ["RANK"])
    stacks = os.environ.get(job_environment.STACKS, "")  # where the watch's looks go
    stacks_file = Path(stacks, stack_dumps.STACK_FILE)

    @elastic.run
    def train(state) -> dict:
        started.set()
        value = torch.ones(1)
        while state.step < STEPS:
            if state.step == STOP_AT and launch_rank == stop_rank:
                Path(out, "stopped").write_text(str(time.time()))
                print(f"rank {launch_rank} stops", flush=True)  # its last sign of life
                if how == "sigstop":
                    os.kill(os.getpid(), signal.SIGSTOP)
                else:
                    stall_jobs.stuck(str(Path(out, "lock")))
            elif state.step == STOP_AT and others_work:
                looked = Path(out, f"looked-{launch_rank}")
                if not looked.exists():  # once: not again after the drop
                    looked.touch()
                    size = stacks_file.stat().st_size
                    while stacks_file.stat().st_size == size:  # until the watch looks
                        print(f"rank {launch_rank} works on", flush=True)
                        time.sleep(1.0)
            dist.all_reduce(value)
            state.step += 1
            state.commit()
            time.sleep(0.02)
        return {"rank": launch_rank, "size": dist.get_world_size(), "step": state.step}

    return train(elastic.ObjectState(step=0))


def run_stopping(out: Path, how: str, caplog):
    runner = sparkdist.HorovodRunner(
        np=4, min_np=2, max_np=4, ranks_per_task=2, stall_timeout=STALL_TIMEOUT_S, env=ENV
    )
    with caplog.at_level(logging.WARNING, logger="sparkdist"):
        results = runner.run_all(stop_one_rank, out=str(out), how=how)
    reformed_at = time.time()
    stopped_at = float((out / "stopped").read_text())
    print(f"{how}: {reformed_at - stopped_at:.1f} s from the stop to the job's end")
    log = "\n".join(record.getMessage() for record in caplog.records)
    return runner, results, log


def assert_dropped(runner, results, log: str, why: str) -> str:
    """Rank 3 was dropped as silent, for `why`; the others ended the job; rank 3's log."""
    assert sorted(r["rank"] for r in results) == [0, 1, 2], results
    assert all(r["size"] == 3 and r["step"] == STEPS for r in results), results
    job = runner.last_job
    assert job.attempts == 1 and job.failures == [], job.failures
    assert len(job.reformed) == 1, job.reformed
    assert "rank 3 on host " in job.reformed[0] and " was silent for " in job.reformed[0]
    assert why in job.reformed[0], job.reformed
    silent = [line for line in log.splitlines() if "is silent: no sign of life" in line]
    assert len(silent) == 1 and "rank 3 (host " in silent[0] and why in silent[0], log
    assert f"stall_timeout={STALL_TIMEOUT_S}" in silent[0]
    assert "world 4 -> 3 ranks in process: rank 3 on host " in log, log
    assert_nothing_left(runner)
    rank_log = Path(job.rank_logs, "rank-3.log").read_text()
    assert "[sparkdist] rank 3 (host " in rank_log and why in rank_log, rank_log
    return rank_log


def test_a_sigstopped_rank_is_dropped_and_the_others_go_on(sc, tmp_path, caplog):
    runner, results, log = run_stopping(tmp_path, "sigstop", caplog)
    assert_dropped(runner, results, log, NO_STACKS)
    assert "(no stacks within " in log  # the grouped stacks say it too
    assert "all_reduce <- train (test_elastic_stopped_rank.py:" in log, log


def test_a_rank_stuck_on_a_lock_has_its_stacks_logged_and_is_dropped(sc, tmp_path, caplog):
    (tmp_path / "lock").touch()
    runner, results, log = run_stopping(tmp_path, "lock", caplog)
    stuck = "stuck (stall_jobs.py:"
    rank_log = assert_dropped(runner, results, log, f"its own code ({stuck}")
    # its stacks, grouped, in the job's log (beside the others', in all_reduce) ...
    assert "rank 3 (host " in log and f"{stuck}" in log, log
    assert "ranks 0-2 (host " in log and "all_reduce <- train" in log, log
    # ... and in full in its rank log
    assert "[sparkdist] stacks (no sign of life for " in rank_log, rank_log
    assert "stall_jobs.py" in rank_log and " in stuck" in rank_log, rank_log


# --- a stopped rank costs stall_timeout, whatever the others say meanwhile ------------------

COLLECTIVE_TIMEOUT_S = 8
"""The elastic collective timeout, shorter than `stall_timeout`: the others' collective
breaks first, and they say so (their own signs of life, not the stopped rank's)."""
SILENT_TIMEOUT_S = 10
MARGIN_S = 3.0
"""The watch's tick (1 s), the stopped rank's last line reaching the driver, and the
machine's load: far less than the collective timeout, which the drop cost before the fix."""


def _decided_at(records: list[logging.LogRecord]) -> float:
    """When the world decided to go on without the stopped rank (wall seconds): the stall
    watch's look (its silent line, less the time the stacks it logged with it took), else
    the world's change."""
    messages = [(record.created, record.getMessage()) for record in records]
    silent = [at for at, message in messages if "is silent: no sign of life" in message]
    if not silent:
        return next(at for at, message in messages if "world 4 -> 3 ranks in process" in message)
    pattern = re.compile(r"Where each rank was \(.*; stacks taken in ([\d.]+)s\)")
    taken = [(at, float(m.group(1))) for at, text in messages if (m := pattern.search(text))]
    _, taken_s = min(taken, key=lambda found: abs(found[0] - silent[0]))
    return silent[0] - taken_s


def test_a_stopped_rank_costs_stall_timeout_after_its_own_last_sign_of_life(sc, tmp_path, caplog):
    """Launch rank 3 prints a line and SIGSTOPs itself; the others' collective times out
    (8 s) and they say so, going back to their commit. Rank 3 is dropped
    `stall_timeout` after its own last line, not after theirs (before the fix: 8 s later,
    at 18-19 s), and the three others end the job."""
    runner = sparkdist.HorovodRunner(
        np=4,
        min_np=2,
        max_np=4,
        ranks_per_task=2,
        stall_timeout=SILENT_TIMEOUT_S,
        env={"SPARKDIST_ELASTIC_TIMEOUT_S": str(COLLECTIVE_TIMEOUT_S)},
    )
    with caplog.at_level(logging.WARNING, logger="sparkdist"):
        results = runner.run_all(stop_one_rank, out=str(tmp_path), how="sigstop")
    assert sorted(r["rank"] for r in results) == [0, 1, 2], results
    assert all(r["size"] == 3 and r["step"] == STEPS for r in results), results
    job = runner.last_job
    assert job.attempts == 1 and job.failures == [], job.failures
    assert len(job.reformed) == 1 and "rank 3 on host " in job.reformed[0], job.reformed
    stopped_at = float((tmp_path / "stopped").read_text())  # its last line came after this
    cost = _decided_at(caplog.records) - stopped_at
    print(f"rank 3 left the world {cost:.1f} s after its last sign of life")
    assert cost <= SILENT_TIMEOUT_S + MARGIN_S, cost
    assert_nothing_left(runner)


# --- a look that singles nobody out is soon followed by another -----------------------------

RELOOK_TIMEOUT_S = 10
RELOOK_BOUND_S = RELOOK_TIMEOUT_S + relook_s(RELOOK_TIMEOUT_S) + MARGIN_S
"""When the stuck rank must be dropped, after its last sign of life: `stall_timeout`, one
re-look's wait, and the margin; before the fix, two `stall_timeout`s and more."""


def test_a_stuck_rank_is_dropped_soon_after_a_look_that_found_nobody(sc, tmp_path, caplog):
    """The stall watch's first look at launch rank 0, stuck on a lock, finds the others in
    their own code too, and singles nobody out; they then wait for it in `all_reduce`. The
    watch looks again `relook_s` later, its silence still counted from its own last line,
    and drops it (before the fix: a whole `stall_timeout` after the first look, 21 s or more
    after its last line); the three others end the job."""
    (tmp_path / "lock").touch()
    runner = sparkdist.HorovodRunner(
        np=4, min_np=2, max_np=4, ranks_per_task=2, stall_timeout=RELOOK_TIMEOUT_S, env=ENV
    )
    with caplog.at_level(logging.WARNING, logger="sparkdist"):
        with caplog.at_level(logging.DEBUG, logger="sparkdist.runner.driver.stalls"):
            results = runner.run_all(
                stop_one_rank, out=str(tmp_path), how="lock", stop_rank=0, others_work=True
            )
    log = "\n".join(record.getMessage() for record in caplog.records)
    assert sorted(r["rank"] for r in results) == [1, 2, 3], results
    assert all(r["size"] == 3 and r["step"] == STEPS for r in results), results
    job = runner.last_job
    assert job.attempts == 1 and job.failures == [], job.failures
    assert len(job.reformed) == 1 and "rank 0 on host " in job.reformed[0], job.reformed
    # then rank 0 was named, with its stacks beside the others' in all_reduce
    silent = [line for line in log.splitlines() if "is silent: no sign of life" in line]
    assert len(silent) == 1 and "rank 0 (host " in silent[0], log
    assert "its own code (stuck (stall_jobs.py:" in silent[0], silent
    assert "ranks 1-3 (host " in log and "all_reduce <- train" in log, log
    stopped_at = float((tmp_path / "stopped").read_text())  # its last line came after this
    cost = _decided_at(caplog.records) - stopped_at
    said = float(re.search(r"no sign of life for (\d+)s", silent[0]).group(1))
    print(f"rank 0 dropped {cost:.1f} s after its last sign of life (said: {said:.0f} s)")
    assert cost <= RELOOK_BOUND_S < 2 * RELOOK_TIMEOUT_S, cost
    assert said >= cost - MARGIN_S, (said, cost)  # counted from its own last sign of life
    # its first look singled nobody out: the others were in their own code
    assert "; nobody singled out, next look in 3s" in log, log
    rank_log = Path(job.rank_logs, "rank-0.log").read_text()
    assert "[sparkdist] stacks (rank 0 silent for " in rank_log, rank_log
    assert_nothing_left(runner)


def test_a_member_slow_to_start_is_no_stall(sc, tmp_path):
    """Launch rank 1's import sleeps three stall timeouts, in silence; rank 0 printed its
    line and waits for it in the world's forming. Nothing is stalled while a member starts
    (its start counts against `start_timeout`): the world forms with both and the job ends
    well (before the fix: `JobStalledError`, as rank 1 could not be dropped below min_np)."""
    (tmp_path / "slow_start.py").write_text("import time\n\ntime.sleep(15)\n")
    runner = sparkdist.HorovodRunner(np=2, min_np=2, max_np=2, ranks_per_task=2, stall_timeout=5)
    sizes = runner.run_all(stall_jobs.elastic_slow_start, module_dir=str(tmp_path))
    assert sizes == [2, 2], sizes
    assert runner.last_job.failures == [] and runner.last_job.reformed == []
    assert_nothing_left(runner)
