"""Where each rank is: real faulthandler dumps of real processes, grouped; the dump
contract between a supervisor and its rank; the straggler measure; and jobs on the
driver (np < 0, no Spark) that hang, stall or are interrupted.

The cluster's cases (np=3 under both launchers, stragglers) are in
tests/runner/test_stalls_cluster.py; Spark Connect's relay mode in tests/spark/test_connect.py."""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
import stall_jobs
from helpers import assert_nothing_left

from sparkdist import HorovodRunner, job_environment
from sparkdist.errors import JobStalledError, JobTimeoutError, RankFailedError
from sparkdist.protocol import left_stacks, stack_dumps
from sparkdist.runner.driver import stacks
from sparkdist.runner.driver.job_spec import RunnerOptions
from sparkdist.runner.driver.records import RankRecords
from sparkdist.runner.driver.stalls import RATIO, SUSTAIN_S, WINDOW_S, Stragglers

ROOT = Path(__file__).resolve().parents[2]

# A process like a rank: it listens for stack requests, then blocks in the user's code
# (a lock, or a queue a reader thread never fills), with helper threads around; or keeps
# its frames moving (starting threads, reloading a module), or holds the GIL in C (a
# regular expression that backtracks for ever).
BLOCKED = textwrap.dedent(
    """
    import importlib, json.decoder, os, queue, re, sys, threading
    from sparkdist.protocol import stack_dumps

    def stuck(lock):
        lock.acquire()

    def consume(batches):
        return batches.get()

    def reader_never_returns(event):
        event.wait()

    def idle(event):
        event.wait()

    def churn():
        while True:
            threads = [threading.Thread(target=importlib.reload, args=(json.decoder,))
                       for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()

    def backtrack():
        re.match(r"(a+)+$", "a" * 60 + "b")

    stack_dumps.listen(os.environ, 0)
    how = sys.argv[1]
    for _ in range(int(sys.argv[2])):
        threading.Thread(target=idle, args=(threading.Event(),), daemon=True).start()
    if how == "lock":
        lock = threading.Lock()
        lock.acquire()
        print("ready", flush=True)
        stuck(lock)
    elif how in ("churn", "backtrack"):
        print("ready", flush=True)
        churn() if how == "churn" else backtrack()
    else:
        threading.Thread(target=reader_never_returns, args=(threading.Event(),),
                         daemon=True).start()
        print("ready", flush=True)
        consume(queue.Queue())
    """
)


@pytest.fixture
def blocked(tmp_path):
    """Start a process like a rank (`how`, with `threads` idle helper threads); yield its
    pid and the supervisor's half; kill it afterwards."""
    script = tmp_path / "blocked.py"
    script.write_text(BLOCKED)
    started = []

    def start(how: str, threads: int = 0):
        taker = stack_dumps.StackTaker()
        env = {**os.environ, "PYTHONPATH": str(ROOT), **taker.rank_env(os.environ)}
        proc = subprocess.Popen(
            [sys.executable, str(script), how, str(threads)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append((proc, taker))
        assert proc.stdout.readline().strip() == "ready"
        return proc.pid, taker

    yield start
    for proc, taker in started:
        proc.kill()
        proc.wait()
        taker.close()


def blocked_in(taker: stack_dumps.StackTaker, pid: int, function: str, nccl: bool = False):
    """The process's dump once its main thread is in `function` (it prints "ready" just
    before it calls it)."""
    deadline = time.monotonic() + 30
    while True:
        text, dump = taker.take(pid, nccl)
        if f" in {function}\n" in text or time.monotonic() > deadline:
            return text, dump


def test_a_rank_blocked_on_a_lock_gives_every_threads_stack(blocked):
    pid, taker = blocked("lock", threads=3)
    text, nccl = blocked_in(taker, pid, "stuck", nccl=True)
    assert nccl == b""  # no NCCL communicator: nothing to dump, and no wait for one
    threads = stacks.parse(text)
    assert len(threads) == 6  # main, 3 idle helpers, the stacks and NCCL threads (folded)
    lines = BLOCKED.splitlines()
    acquire = lines.index("    lock.acquire()", lines.index("def stuck(lock):")) + 1
    call = lines.index("    stuck(lock)") + 1
    idle = lines.index("    event.wait()", lines.index("def idle(event):")) + 1
    assert stacks.summary(text) == (
        f"stuck (blocked.py:{acquire}) <- <module> (blocked.py:{call})",
        f"3 threads: wait <- idle (blocked.py:{idle})",
    )


def test_a_rank_waiting_for_its_reader_names_the_reader_thread_too(blocked):
    pid, taker = blocked("queue")
    text, _ = blocked_in(taker, pid, "consume")
    main, reader = stacks.summary(text)
    assert main.startswith("wait <- consume (blocked.py:")  # queue, threading folded
    assert reader.startswith("thread: wait <- reader_never_returns (blocked.py:")


def test_identical_stacks_show_once_with_their_ranks_and_hosts(blocked):
    lock_pid, taker = blocked("lock")
    queue_pid, other = blocked("queue")
    lock_text = blocked_in(taker, lock_pid, "stuck")[0]
    queue_text = blocked_in(other, queue_pid, "consume")[0]
    answers = {
        0: stacks.RankStacks("a", queue_text),
        1: stacks.RankStacks("b", lock_text),
        2: stacks.RankStacks("c", queue_text),
        3: stacks.RankStacks("d", ""),
    }
    lines = stacks.group(answers, wait_s=4)
    assert lines[0].startswith("ranks 0,2 (hosts a, c): wait <- consume (blocked.py:")
    assert lines[1] == "    " + stacks.summary(queue_text)[1]
    assert lines[2].startswith("rank 1 (host b): stuck (blocked.py:")
    assert lines[3].startswith("rank 3 (host d): (no stacks within 4 s")


def _current_thread(text: str) -> str:
    """The dump's thread that wrote it (faulthandler's "Current thread")."""
    return text.split("Current thread", 1)[1].split("\nThread ", 1)[0]


def test_stacks_come_from_the_ranks_thread_not_a_signal(blocked):
    """A rank whose frames keep changing (threads starting, modules reloading) answers
    50 requests in a row from its stacks thread, holding the GIL: no signal is sent, so
    none can catch faulthandler mid-frame (CPython gh-116008), and the rank lives on."""
    pid, taker = blocked("churn")
    for _ in range(50):
        text, _ = blocked_in(taker, pid, "churn")
        assert "in _serve_stacks" in _current_thread(text), text  # the stacks thread's
        assert " in churn\n" in text
    assert os.waitpid(pid, os.WNOHANG) == (0, 0)  # still running


def test_a_rank_holding_the_gil_in_c_answers_by_signal(blocked):
    """The stacks thread cannot run while the main thread holds the GIL in C: after
    `GIL_WAIT_S` the supervisor signals, and faulthandler's handler answers in time."""
    pid, taker = blocked("backtrack")
    started = time.monotonic()
    text, _ = blocked_in(taker, pid, "backtrack")
    assert " in backtrack\n" in text and time.monotonic() - started < 30
    assert " in backtrack\n" in _current_thread(text)  # the main thread wrote it: the signal's


def test_a_rank_gone_or_not_listening_gives_nothing_at_once():
    taker = stack_dumps.StackTaker()
    try:
        started = time.monotonic()
        assert taker.take(os.getpid(), nccl=True) == ("", b"")  # never listened
        assert time.monotonic() - started < stack_dumps.WAIT_S
        assert taker.rank_env({"TORCH_NCCL_TRACE_BUFFER_SIZE": "10"}) == {
            "SPARKDIST_STACKS": taker.directory
        }
        assert taker.rank_env({})["TORCH_FR_BUFFER_SIZE"] == "2000"
    finally:
        taker.close()


def test_left_stacks_are_the_users_only_read_once_and_stale_ones_go(tmp_path, monkeypatch):
    """Relay mode: what a cut-off supervisor leaves on its host for the client."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    prefix = left_stacks.job_prefix("job1")
    left_stacks.leave(prefix, 1, "h1", "stacks of 1", b"nccl")
    left_stacks.leave(prefix, 0, "h0", "", b"")
    other = left_stacks.job_prefix("job2") + "rank0"
    left_stacks.leave(left_stacks.job_prefix("job2"), 0, "h", "x", b"")
    assert {p.stat().st_mode & 0o777 for p in tmp_path.iterdir()} == {0o600}
    found = sorted(left_stacks.entries(left_stacks.collect("job1")))
    assert found == [(0, "h0", "", b""), (1, "h1", "stacks of 1", b"nccl")]
    assert left_stacks.entries(left_stacks.collect("job1")) == []
    assert os.listdir(tmp_path) == [os.path.basename(other)]
    left_stacks.remove_stale(time.time() + left_stacks.STALE_S / 2)
    assert os.path.exists(other)
    left_stacks.remove_stale(time.time() + left_stacks.STALE_S + 1)
    assert os.listdir(tmp_path) == []


def test_a_relayed_supervisor_cut_off_twice_leaves_the_stacks_before_it_stops(
    tmp_path, monkeypatch
):
    """Relay mode: a cancelled stage cuts a supervisor off several ways at once, e.g.
    a SIGTERM (its task or orted stopping it), then its parent's death (SIGHUP) while
    it is still taking the stacks. The second waits for them: they are left on the
    host before the rank is stopped, and nothing is left running."""
    prefix = str(tmp_path / "left-")
    monkeypatch.setenv(job_environment.LEFT_STACKS, prefix)
    note = tmp_path / "note"
    runner = HorovodRunner(np=-1, launcher="direct")
    outcome: dict = {}
    job = threading.Thread(target=_run_failing, args=(runner, str(note), outcome), daemon=True)
    job.start()
    assert _until(note.exists, 120)
    supervisor, directory = note.read_text().split(" ", 1)
    answers = Path(directory, stack_dumps.STACK_FILE)
    os.kill(int(supervisor), signal.SIGTERM)
    assert _until(lambda: answers.stat().st_size > 0, 30)  # the rank answered: taking
    os.kill(int(supervisor), signal.SIGHUP)
    job.join(120)
    assert not job.is_alive()
    # Asserted here, not in the thread: a failed check there would only warn.
    assert "error" in outcome, f"the job did not fail: it returned {outcome.get('result')!r}"
    assert isinstance(outcome["error"], Exception), outcome  # its supervisor was cut off
    left = json.loads(Path(f"{prefix}rank0").read_text())
    assert re.search(r"stall_jobs.py\", line \d+ in wait_noting_supervisor", left["text"]), left
    assert_nothing_left(runner)


def _run_failing(runner, note: str, outcome: dict) -> None:
    """The job, from a thread: what it returned or raised goes into `outcome` (the test
    asserts on it in its own thread)."""
    try:
        outcome["result"] = runner.run(stall_jobs.wait_noting_supervisor, note_file=note)
    except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
        outcome["error"] = exc


def _until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def test_library_frames_fold_and_user_frames_come_first():
    dump = textwrap.dedent(
        """\
        Thread 0x00007f0000000001 (most recent call first):
          File "/usr/lib/python3.11/threading.py", line 327 in wait
          File "/work/job/train.py", line 30 in stuck

        Current thread 0x00007f0000000002 (most recent call first):
          File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2950 in all_reduce
          File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
          File "/work/job/train.py", line 42 in step
          File "/opt/sparkdist/elastic/run.py", line 80 in run
          File "/work/job/train.py", line 60 in main
          File "/opt/sparkdist/runner/rank/main.py", line 80 in main
          File "<frozen runpy>", line 88 in _run_code
        """  # noqa: E501 - a dump's lines as faulthandler writes them
    )
    assert stacks.summary(dump) == (
        "all_reduce <- step (train.py:42) <- main (train.py:60)",
        "thread: wait <- stuck (train.py:30)",
    )


def test_errors_keep_their_stacks_through_pickling():
    error = RankFailedError(1, "b", 1, "Traceback...\nValueError: x", ["out"], "raised")
    error.with_stacks("Where each rank was:\n  rank 0 (host a): f (x.py:1)")
    again = pickle.loads(pickle.dumps(error))
    assert str(again).count("Where each rank was") == 1 and again.stacks == error.stacks
    stalled = pickle.loads(pickle.dumps(JobStalledError("stalled").with_stacks("here")))
    assert str(stalled) == "stalled\n\nhere" and isinstance(stalled, JobTimeoutError)


def _records(n: int) -> RankRecords:
    from sparkdist.runner.driver.console import Console

    ranks = RankRecords(n, threading.Condition(), Console(), "all")
    for rank in range(n):
        ranks.located(rank, f"host-{rank}")
    return ranks


def _feed(
    stragglers: Stragglers,
    ranks: RankRecords,
    rates: dict[int, float],
    seconds: int,
    start: int = 0,
) -> list[str]:
    """Feed a second of steps at a time, each rank at its `rates` (counts go on from
    where they were); what was said."""
    said = []
    for now in range(start + 1, start + seconds + 1):
        for rank, rate in rates.items():
            _counts[rank] = _counts.get(rank, 0.0) + rate
            stragglers.progress(rank, "report", int(_counts[rank]), float(now))
        said += stragglers.check(float(now), ranks)
    return said


_counts: dict[int, float] = {}


@pytest.fixture(autouse=True)
def _fresh_counts():
    _counts.clear()


def test_a_straggler_is_named_once_with_its_host_and_again_when_it_recovers():
    ranks, stragglers = _records(3), Stragglers()
    slow = {0: 10.0, 1: 2.0, 2: 10.0}
    said = _feed(stragglers, ranks, slow, int(WINDOW_S + SUSTAIN_S) + 5)
    assert said == [
        "rank 1 (host host-1) is a straggler: 2.00 steps/s against the median 10.00 (5.0x slower)"
    ]
    assert list(stragglers.slow) == [1]
    said = _feed(stragglers, ranks, {0: 10.0, 1: 10.0, 2: 10.0}, 20, start=20)
    assert [line.split(":")[0] for line in said] == ["rank 1 (host host-1) keeps up again"]
    assert stragglers.slow == {} and len(stragglers.notes) == 2


def test_a_rank_the_world_went_on_without_is_no_straggler():
    """An in-process world that lost ranks 2 and 3 measures them no more: their rates
    fall to 0, which would name them (and drag the median) if they counted."""
    ranks, stragglers = _records(4), Stragglers()
    _feed(stragglers, ranks, {0: 10.0, 1: 10.0, 2: 10.0, 3: 10.0}, 10)
    said = []
    for now in range(11, 30):
        for rank in (0, 1):
            _counts[rank] += 10.0
            stragglers.progress(rank, "report", int(_counts[rank]), float(now))
        said += stragglers.check(float(now), ranks, gone={2, 3})
    assert said == [] and stragglers.slow == {}


def test_even_ranks_and_a_mild_slowdown_name_nobody():
    ranks, stragglers = _records(3), Stragglers()
    assert _feed(stragglers, ranks, {0: 10.0, 1: 9.0, 2: 11.0}, 30) == []
    assert _feed(stragglers, ranks, {0: 10.0, 1: 7.5, 2: 10.0}, 30, start=30) == []  # 1.33x


def _spell(spell_s: int, begin: int = 15, end: int = 40) -> list[tuple[int, bool, list]]:
    """Three ranks at 10 steps/s, rank 1 at 2 steps/s for `spell_s` seconds from second
    `begin`, checked once a second as the stall watch does (`TICK_S`): for each second,
    whether rank 1's measured rate (over `WINDOW_S`) was `RATIO` times under the median,
    and what was said."""
    ranks, stragglers = _records(3), Stragglers()
    counts, seconds = [0.0, 0.0, 0.0], []
    for now in range(1, end + 1):
        for rank in range(3):
            slow = rank == 1 and begin < now <= begin + spell_s
            counts[rank] += 2.0 if slow else 10.0
            stragglers.progress(rank, "report", int(counts[rank]), float(now))
        rates = stragglers.rates(float(now))
        slow_now = bool(rates) and rates[1] * RATIO <= statistics.median(rates.values())
        seconds.append((now, slow_now, stragglers.check(float(now), ranks)))
    return seconds


def test_a_short_slow_spell_names_nobody_a_sustained_one_names_the_rank_and_its_recovery():
    """A slow rate must last `SUSTAIN_S` before the rank is named, and an even one as
    long before its recovery is: a spell of 3 s at 5x slower shows in the measured rate
    for 2 s (under SUSTAIN_S) and names nobody; one of 8 s names the rank SUSTAIN_S after
    its measured rate fell, and its recovery SUSTAIN_S after the rate came back."""
    short = _spell(3)
    slow = [now for now, slow_now, _ in short if slow_now]
    assert slow and slow[-1] - slow[0] < SUSTAIN_S, slow  # slow, measured, but briefly
    assert [said for _, _, said in short if said] == []
    sustained = _spell(8)
    slow = [now for now, slow_now, _ in sustained if slow_now]
    said = {now: lines for now, _, lines in sustained if lines}
    named, recovered = slow[0] + SUSTAIN_S, slow[-1] + 1 + SUSTAIN_S
    assert list(said) == [named, recovered], said
    assert said[named][0].startswith("rank 1 (host host-1) is a straggler: ")
    assert said[recovered][0].startswith("rank 1 (host host-1) keeps up again: ")


def test_stall_options_are_checked_and_off_turns_them_off():
    assert RunnerOptions(np=2).stall_warning == 300.0
    assert RunnerOptions(np=2, stall_warning=None).stall_warning is None
    with pytest.raises(ValueError, match="stall_timeout must be a positive"):
        RunnerOptions(np=2, stall_timeout=0)
    from sparkdist.cli import build_parser

    args = build_parser().parse_args(
        ["run", "--np", "2", "--stall-warning", "off", "--stall-timeout", "20", "x.py"]
    )
    assert args.stall_warning is None and args.stall_timeout == 20.0


# --- jobs on the driver (np < 0): the same service, supervisors and ranks, no Spark -------


def ready(steps: int) -> int:
    """A first run on a warm world: torch imported, a group formed, as `lock_job` does."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.ones(1)
    for _ in range(steps):
        dist.all_reduce(value)
    dist.destroy_process_group()
    return int(value.item())


def test_a_time_limit_says_where_each_rank_was(tmp_path):
    """The limit counts from its run's start, and rank 1 must be at its lock when it runs
    out. The ranks import torch (seconds, many under load) in a first run without a limit,
    on a warm world; the limited run then finds them ready, and its 25 s cover only the
    group and five steps (about a second), not the import."""
    lock = tmp_path / "lock"
    lock.touch()
    shape = dict(np=-3, launcher="direct", keep_warm=120)
    with HorovodRunner(**shape) as cold, HorovodRunner(**shape, timeout=25) as runner:
        assert cold.run(ready, steps=2) == 9  # 3 ranks, two all_reduce: 3 * 3
        with pytest.raises(JobTimeoutError) as failed:
            runner.run(stall_jobs.lock_job, lock_file=str(lock))
    assert Path(f"{lock}.stuck").exists()  # rank 1 was at its lock
    where = failed.value.stacks
    assert "ranks 0,2 (host " in where and "): all_reduce <- lock_job (stall_jobs.py:" in where
    assert "rank 1 (host " in where and "): stuck (stall_jobs.py:" in where
    assert where in str(failed.value)
    log = (Path(runner.last_job.rank_logs) / "rank-1.log").read_text()
    assert "[sparkdist] stacks (the job's time limit ran out" in log and "in stuck" in log
    assert_nothing_left(runner)


def test_a_stall_warning_shows_the_stacks_and_the_job_goes_on(tmp_path, caplog):
    lock = tmp_path / "lock"
    lock.touch()
    warned = threading.Event()

    class Release(logging.Handler):
        def emit(self, record):
            # A warning may come while the ranks import torch; the lock goes once rank 1 is stuck.
            if "stuck (stall_jobs.py" in record.getMessage():
                warned.set()
                lock.unlink()  # the stuck rank goes on

    handler = Release()
    logging.getLogger("sparkdist").addHandler(handler)
    try:
        runner = HorovodRunner(np=-2, launcher="direct", stall_warning=4)
        result = runner.run_all(stall_jobs.lock_job, lock_file=str(lock), steps=10)
    finally:
        logging.getLogger("sparkdist").removeHandler(handler)
    assert warned.is_set() and result == [0, 1]
    warning = next(r.getMessage() for r in caplog.records if "stuck (" in r.getMessage())
    assert "rank 0 (host " in warning and "all_reduce <- lock_job (stall_jobs.py:" in warning
    assert "rank 1 (host " in warning and "stuck (stall_jobs.py:" in warning


def test_a_stall_timeout_fails_the_job_with_the_stacks(tmp_path):
    runner = HorovodRunner(np=-2, launcher="direct", stall_timeout=5, stall_warning=None)
    started = time.monotonic()
    with pytest.raises(JobStalledError) as failed:
        runner.run(stall_jobs.silent_wait, ready_file=str(tmp_path / "ready"))
    assert time.monotonic() - started < 60  # not a time limit: the stall ended it
    assert "stalled: no rank showed a sign of life" in str(failed.value)
    assert "ranks 0-1 (host " in failed.value.stacks
    assert "): silent_wait (stall_jobs.py:" in failed.value.stacks
    assert_nothing_left(runner)


def test_py_spy_is_found_beside_python_and_can_be_turned_off(tmp_path):
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    assert os.access(beside, os.X_OK), "py-spy (requirements/lock.txt) is not installed"
    assert stack_dumps.find_py_spy({"PATH": str(tmp_path)}) == beside  # not on PATH
    assert stack_dumps.find_py_spy({"SPARKDIST_PY_SPY": beside, "PATH": ""}) == beside
    assert stack_dumps.find_py_spy({"SPARKDIST_PY_SPY": "off"}) is None
    assert stack_dumps.find_py_spy({"SPARKDIST_PY_SPY": str(tmp_path / "none")}) is None


def _held_lock_job(tmp_path: Path, env: dict[str, str]) -> tuple[str, str]:
    """`held_lock` at np=-1 (a real supervisor and rank) under a 1 s stall warning that
    releases the lock once it shows the rank there; the warning, and the rank's log."""
    tmp_path.mkdir()
    lock = tmp_path / "lock"
    lock.touch()
    warnings = []

    class Release(logging.Handler):
        def emit(self, record):
            if "held_lock (stall_jobs.py" in record.getMessage() and lock.exists():
                warnings.append(record.getMessage())
                lock.unlink()

    handler = Release()
    logging.getLogger("sparkdist").addHandler(handler)
    try:
        runner = HorovodRunner(np=-1, launcher="direct", stall_warning=1, env=env)
        assert runner.run(stall_jobs.held_lock, lock_file=str(lock)) == 0
    finally:
        logging.getLogger("sparkdist").removeHandler(handler)
    grouped = [line for line in warnings[0].splitlines() if line.startswith("  rank")]
    return "\n".join(grouped), (Path(runner.last_job.rank_logs) / "rank-0.log").read_text()


def test_py_spy_adds_the_native_frames_to_the_rank_log_and_nothing_else(tmp_path):
    """The rank is blocked in C (a lock): faulthandler's dump ends at the Python frame,
    py-spy's goes on into libpython and libc. The grouped stacks are the same without it."""
    asked = {"SPARKDIST_PY_SPY": "", "SPARKDIST_PY_SPY_NATIVE": "1"}  # look it up; native
    grouped, log = _held_lock_job(tmp_path / "with", asked)
    assert "native stacks (py-spy dump --native --pid " in log, log
    native = log[log.index("native stacks (py-spy") :]
    assert "PyThread_acquire_lock_timed (libpython" in native, native
    assert "(libc.so" in native and "held_lock (stall_jobs.py:" in native, native
    assert re.search(r"rank 0 \(host [^)]+\): held_lock \(stall_jobs\.py:\d+\)", grouped)

    without, log = _held_lock_job(tmp_path / "without", {"SPARKDIST_PY_SPY": "off"})
    assert "in held_lock" in log and "py-spy" not in log and "libpython" not in log, log
    assert without == grouped


NOTEBOOK = textwrap.dedent(
    """
    import json, logging, sys, time
    logging.basicConfig(level=logging.WARNING)
    sys.path.insert(0, sys.argv[1])
    import stall_jobs
    from sparkdist import HorovodRunner

    runner = HorovodRunner(np=-2, launcher="direct")
    try:
        runner.run(stall_jobs.silent_wait, ready_file="")
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
    deadline = time.monotonic() + 15
    while any(p.alive() for p in runner.last_job.processes) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p.pid for p in runner.last_job.processes if p.alive()]
    print("RESULT " + json.dumps({"left": left}), flush=True)
    """
)


def test_ctrl_c_in_a_notebook_like_script_shows_the_stacks_and_leaves_nothing(tmp_path):
    script = tmp_path / "notebook.py"
    script.write_text(NOTEBOOK)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(Path(__file__).parents[1])],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = []
    try:
        for line in proc.stdout:
            output.append(line)
            if "[ranks 0,1] waiting" in line or line.startswith("[rank 1] waiting"):
                break
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = "".join(output) + rest
    assert "Where each rank was (interrupted" in text, text
    assert "silent_wait (stall_jobs.py:" in text and "INTERRUPTED" in text
    assert text.index("Where each rank was") < text.index("INTERRUPTED")
    assert '"left": []' in text


def test_the_nccl_command_names_the_directory_and_the_dumps_prefix():
    from sparkdist.runner.driver.stalls import NCCL_COMMAND

    command = NCCL_COMMAND.format(directory="/tmp/run/attempt-1")
    assert command == "torchfrtrace /tmp/run/attempt-1 --prefix nccl_trace_rank_ -j"


NO_NCCL = (
    "import torch, torch.distributed\n"
    "from sparkdist.protocol import stack_dumps\n"
    "print(repr(stack_dumps.nccl_trace()))\n"
)


def test_a_process_without_an_nccl_communicator_has_no_nccl_dump():
    """A fresh process (not this worker, where an earlier module may have started CUDA):
    torch.distributed imported, CUDA never started, nothing to dump."""
    seen = subprocess.run(
        [sys.executable, "-c", NO_NCCL],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert seen.returncode == 0 and seen.stdout.strip() == "None", seen.stdout + seen.stderr


def test_sigterm_to_sparkdist_run_shows_the_stacks_and_stops_the_job(tmp_path):
    script = tmp_path / "waits.py"
    script.write_text(
        "import time\n\ndef wait_here():\n    time.sleep(600)\n\n"
        "print('ready', flush=True)\nwait_here()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparkdist", "run", "--np", "-1", "--launcher", "direct", script],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in proc.stdout:
            if "[rank 0] ready" in line:
                break
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "Where each rank was (interrupted" in err, err
    assert "rank 0 (host " in err and "wait_here (waits.py:4) <- <module> (waits.py:7)" in err


def test_stragglers_are_measured_while_the_service_adds_samples():
    """The stall watch reads the samples while the service's loop adds them: without a
    lock that raised "deque mutated during iteration" (hundreds of times in 2 s with a
    short switch interval), and the watch logged a traceback and lost its tick."""
    stragglers, stop, errors = Stragglers(), threading.Event(), []

    def feed() -> None:
        count = 0
        while not stop.is_set():
            count += 1
            for rank in range(4):
                stragglers.progress(rank, "report", count, count * 0.001)

    feeder = threading.Thread(target=feed, daemon=True)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    feeder.start()
    try:
        for _ in range(3_000):
            try:
                stragglers.rates(10.0)
            except RuntimeError as exc:
                errors.append(exc)
    finally:
        stop.set()
        feeder.join()
        sys.setswitchinterval(switch)
    assert errors == []
