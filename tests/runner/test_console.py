"""The driver's console with many ranks: identical lines collapse into one naming the
ranks, other ranks' progress bars stay off the console, a flood is cut without losing
a warning, an error or a traceback, and every rank's lines are in its own file. Unit
tests drive a real `Console` over in-memory streams; the jobs are real ranks."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import pytest
from helpers import assert_nothing_left

from sparkdist import HorovodRunner, RankFailedError
from sparkdist.runner.driver.console import Console, spans
from sparkdist.runner.driver.rank_logs import KEEP_RUNS, RankFiles, RunLogs, remove_old_runs


def _console(tmp_path: Path, **kw) -> tuple[Console, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    return Console(out, err, log_dir=tmp_path / "ranks", **kw), out, err


def test_spans_name_ranges():
    assert spans([3, 0, 1, 2, 5, 7, 8]) == "0-3,5,7-8"
    assert spans([4]) == "4"


def test_identical_lines_collapse_and_each_rank_keeps_its_order(tmp_path):
    console, out, _ = _console(tmp_path, window_s=60)
    for rank in range(256):
        console.write("stdout", f"[rank {rank}] epoch 1 done")
        console.write("stdout", f"[rank {rank}] loss {rank % 2}")
    console.write("stdout", "[rank 7] epoch 1 done")  # again: after rank 7's "loss"
    assert out.getvalue() == ""  # held for the window
    console.close()
    assert out.getvalue().splitlines() == [
        "[ranks 0-255] epoch 1 done",
        f"[ranks {spans(list(range(0, 256, 2)))}] loss 0",
        f"[ranks {spans(list(range(1, 256, 2)))}] loss 1",
        "[rank 7] epoch 1 done",
    ]
    # 256 files, more than the console keeps open at once: none loses a line.
    for rank in (0, 100, 255):
        assert _lines(tmp_path / "ranks" / f"rank-{rank}.log") == [
            "epoch 1 done",
            f"loss {rank % 2}",
        ]
    assert _lines(tmp_path / "ranks" / "rank-7.log") == [
        "epoch 1 done",
        "loss 1",
        "epoch 1 done",
    ]


def test_lines_collapse_across_each_ranks_own_lines_before_them(tmp_path):
    """Each rank's own line, then a common one, arriving interleaved (as from many hosts):
    the common line still shows once, after every rank's own line."""
    console, out, _ = _console(tmp_path, window_s=60)
    for rank in range(8):
        console.write("stdout", f"[rank {rank}] rank {rank} loaded its shard")
        if rank >= 2:
            console.write("stdout", f"[rank {rank - 2}] epoch 0 done")
    for rank in (6, 7):
        console.write("stdout", f"[rank {rank}] epoch 0 done")
    console.write("stdout", "[rank 3] epoch 1 done")
    console.close()
    assert out.getvalue().splitlines() == [
        *(f"[rank {rank}] rank {rank} loaded its shard" for rank in range(8)),
        "[ranks 0-7] epoch 0 done",
        "[rank 3] epoch 1 done",
    ]


def test_two_ranks_show_as_today(tmp_path):
    console, out, err = _console(tmp_path, window_s=0.05)
    console.write("stdout", "[rank 0] same")
    console.write("stdout", "[rank 1] same")
    console.write("stderr", "[rank 1] to stderr")
    deadline = time.monotonic() + 10
    while "to stderr" not in err.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)  # the console's timer shows the lines; no close needed
    assert out.getvalue().splitlines() == ["[rank 0] same", "[rank 1] same"]
    assert err.getvalue().splitlines() == [
        f"[sparkdist] each rank's full output: {tmp_path / 'ranks'}/rank-N.log",
        "[rank 1] to stderr",
    ]
    console.close()


def test_progress_bars_of_other_ranks_stay_in_their_files(tmp_path):
    console, _, err = _console(tmp_path)
    bar = "\r  0%|          | 0/10\r 50%|#####     | 5/10\r100%|##########| 10/10"
    for rank in range(4):
        console.write("stderr", f"[rank {rank}] {bar}")
    console.write("stderr", f"[rank 2] {bar}\rx.py:3: UserWarning: over the bar")
    console.close()
    shown = err.getvalue().split("\n")[1:-1]
    assert shown == [f"[rank 0] {bar}", "[rank 2] x.py:3: UserWarning: over the bar"]
    assert (tmp_path / "ranks" / "rank-3.log").read_bytes() == f"{bar}\n".encode()


def test_a_flood_is_cut_but_never_a_warning_an_error_or_a_traceback(tmp_path):
    console, out, err = _console(tmp_path, window_s=60, rate=10, burst=20)
    traceback = [
        "Traceback (most recent call last):",
        '  File "train.py", line 3, in <module>',
        "    step()",
        "Boom: rank 200 ran out of data",
    ]
    for i in range(1000):
        for rank in (199, 200, 201):
            console.write("stdout", f"[rank {rank}] step {i} of rank {rank}")
        if i == 500:
            console.write("stderr", "[rank 200] WARNING:root:disk nearly full")
            for line in traceback:
                console.write("stderr", f"[rank 200] {line}")
    console.close()
    assert len(out.getvalue().splitlines()) == 20
    shown = err.getvalue().splitlines()
    assert "[rank 200] WARNING:root:disk nearly full" in shown
    assert [f"[rank 200] {line}" for line in traceback] == [
        line for line in shown if line.startswith("[rank 200]") and "WARNING" not in line
    ]
    assert shown[-1] == (
        f"[sparkdist] 2980 lines of ranks 199-201 not shown (over 10 lines a second); "
        f"every line is in {tmp_path / 'ranks'}"
    )
    assert len(_lines(tmp_path / "ranks" / "rank-200.log")) == 1005


def test_lines_without_a_rank_show_at_once(tmp_path):
    console, out, _ = _console(tmp_path, window_s=60)
    console.write("stdout", "sparkdist run: done")
    assert out.getvalue() == "sparkdist run: done\n"
    assert console.log_dir is None


# --- where the files are: a directory per attempt, the newest runs kept -------------


def test_attempts_of_a_run_share_its_directory_and_are_copied_under_the_checkpoints(tmp_path):
    logs = RunLogs(copy_to=str(tmp_path / "ckpt"), root=tmp_path / "driver")
    for number, job_id in enumerate(["aaaaaaaaaaaa", "bbbbbbbbbbbb"]):
        out, err = io.StringIO(), io.StringIO()
        console = Console(out, err, files=logs.attempt(number, job_id), window_s=60)
        console.write("stdout", f"[rank 1] attempt {number + 1}")
        console.close()
        run = console.log_dir.parent
        assert console.log_dir == tmp_path / "driver" / run.name / f"attempt-{number + 1}"
        assert re.fullmatch(r"\d{8}-\d{6}-aaaaaaaaaaaa", run.name)  # the first attempt's id
        copy = tmp_path / "ckpt" / "logs" / run.name / f"attempt-{number + 1}"
        assert (
            err.getvalue().splitlines()[-1]
            == f"[sparkdist] each rank's full output, copied: {copy}"
        )
        assert _lines(copy / "rank-1.log") == [f"attempt {number + 1}"]
    assert sorted(p.name for p in run.iterdir()) == [".lock", "attempt-1", "attempt-2"]


def test_rank_logs_are_copied_to_a_checkpoint_url(tmp_path):
    """A URL checkpoint directory (an object store: no appends) gets whole files at the end."""
    from pyarrow import fs as pafs

    from sparkdist.checkpoint.driver.store import open_directory

    logs = RunLogs(copy_to="memory://sparkdist-test/console-run", root=tmp_path)
    console = Console(io.StringIO(), io.StringIO(), files=logs.attempt(0, "cccccccccccc"))
    for i in range(3):
        console.write("stdout", f"[rank 0] line {i}")
    console.close()
    filesystem, root = open_directory("memory://sparkdist-test/console-run/logs")
    found = filesystem.get_file_info(pafs.FileSelector(root, recursive=True))
    files = [info.path for info in found if info.type == pafs.FileType.File]
    assert len(files) == 1 and files[0].endswith("/attempt-1/rank-0.log"), files
    with filesystem.open_input_stream(files[0]) as stream:
        assert stream.read() == b"line 0\nline 1\nline 2\n"


def test_the_newest_runs_are_kept_but_never_one_being_written(tmp_path):
    old = [tmp_path / f"20260101-0000{i:02d}-job{i}" for i in range(12)]
    for run in old:
        (run / "attempt-1").mkdir(parents=True)
        (run / "attempt-1" / "rank-0.log").write_text("x\n")
    busy = RankFiles(old[0] / "attempt-2", run=old[0])  # the oldest run still writes
    busy.write(0, "still here")
    new = RankFiles(
        tmp_path / "20270101-000000-new" / "attempt-1", run=tmp_path / "20270101-000000-new"
    )
    new.write(3, "a new run")  # its first line applies the rule
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == sorted(
        [old[0].name, *(r.name for r in old[-(KEEP_RUNS - 1) :]), "20270101-000000-new"]
    )
    busy.close()
    new.close()
    assert remove_old_runs(tmp_path, KEEP_RUNS) == [old[0]]  # no longer written: it goes
    assert len(list(tmp_path.iterdir())) == KEEP_RUNS


# --- real jobs: 8 ranks on two executors --------------------------------------------


STACKS_KEPT = "[sparkdist] stacks (when the first failure was reported):"


def _lines(path: Path) -> list[str]:
    """A per-rank file's lines (a progress bar's carriage returns kept)."""
    return path.read_bytes().decode().split("\n")[:-1]


def _rank_logs(err: str) -> Path:
    found = re.findall(r"^\[sparkdist\] each rank's full output: (\S+)/rank-N\.log$", err, re.M)
    assert found, err[-3000:]
    return Path(found[-1])


def test_eight_ranks_collapse_and_hide_their_bars(sc, capfd):
    def main():
        import os
        import sys

        from sparkdist.protocol.driver_channel import driver_client

        rank = int(os.environ["RANK"])
        client = driver_client()  # a barrier on the driver's rendezvous store
        client.put(f"ready-{rank}", True)
        for other in range(8):
            client.get(f"ready-{other}")
        for epoch in range(3):
            for step in range(5):
                sys.stderr.write(f"\repoch {epoch}: {step * 20}%|{'#' * step}")
                sys.stderr.flush()
            sys.stderr.write("\n")
            print(f"epoch {epoch} done", flush=True)
        print(f"rank {rank} says bye", flush=True)

    HorovodRunner(np=8, ranks_per_task=4, launcher="direct").run(main)
    out, err = capfd.readouterr()
    all_collapsed = []
    for epoch in range(3):
        collapsed = re.findall(rf"^\[ranks ([\d,-]+)\] epoch {epoch} done$", out, re.M)
        singles = re.findall(rf"^\[rank (\d+)\] epoch {epoch} done$", out, re.M)
        named = [int(r) for r in singles]
        for group in collapsed:
            for part in group.split(","):
                low, _, high = part.partition("-")
                named += list(range(int(low), int(high or low) + 1))
        all_collapsed += collapsed
        assert sorted(named) == list(range(8)), out
    assert all_collapsed, out  # lines that name several ranks
    assert re.search(r"^\[rank 0\] \repoch 0: 0%", err, re.M), err
    assert not re.search(r"^\[ranks? [^0]\S*\] \r", err, re.M), err
    logs = _rank_logs(err)
    for rank in range(8):
        lines = _lines(logs / f"rank-{rank}.log")
        assert [line for line in lines if "done" in line] == [f"epoch {e} done" for e in range(3)]
        assert sum("\repoch" in line for line in lines) == 3
        assert f"rank {rank} says bye" in lines
        assert f"[rank {rank}] rank {rank} says bye" in out


def test_an_error_line_in_a_flood_reaches_the_console(sc, capfd):
    def main():
        import os
        import sys

        rank = int(os.environ["RANK"])
        for i in range(1000):
            print(f"rank {rank} line {i}")
            if rank == 5 and i == 600:
                print("ERROR: rank 5 saw a bad batch", file=sys.stderr, flush=True)
        sys.stdout.flush()

    # 8,000 lines, far over the console's burst of 500 and 100 a second for as long as the
    # job takes: the rate limit cuts them (no timing is asserted)
    HorovodRunner(np=8, ranks_per_task=4, launcher="direct").run(main)
    out, err = capfd.readouterr()
    assert "[rank 5] ERROR: rank 5 saw a bad batch" in err
    assert len(out.splitlines()) < 8000
    assert re.search(r"^\[sparkdist\] \d+ lines of ranks \S+ not shown", err, re.M), err[-2000:]
    logs = _rank_logs(err)
    for rank in range(8):
        lines = _lines(logs / f"rank-{rank}.log")
        assert [line for line in lines if line.startswith("rank ")] == [
            f"rank {rank} line {i}" for i in range(1000)
        ]


# --- 32 ranks of plain Python on two executors, and driver_log_verbosity ---------------


def _named(text: str, out: str) -> list[int]:
    """The ranks the console named for `text`: in collapsed lines and single ones."""
    named = [int(r) for r in re.findall(rf"^\[rank (\d+)\] {text}$", out, re.M)]
    for group in re.findall(rf"^\[ranks ([\d,-]+)\] {text}$", out, re.M):
        for part in group.split(","):
            low, _, high = part.partition("-")
            named += list(range(int(low), int(high or low) + 1))
    return sorted(named)


def test_32_ranks_every_line_arrives_collapsed_and_in_its_file(sc, capfd, tmp_path):
    def main():
        import os
        import sys

        from sparkdist.protocol.driver_channel import driver_client

        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        client = driver_client()  # a barrier on the driver's rendezvous store:
        client.put(f"ready-{rank}", True)
        if rank == 0:  # rank 0 waits for every rank, then one key releases them all
            for other in range(size):
                client.get(f"ready-{other}")
            client.put("go", True)
        client.get("go")
        print(f"rank {rank} of {size} here", flush=True)
        for step in range(5):
            sys.stderr.write(f"\rtraining: {step * 25}%|{'#' * step}")
            sys.stderr.flush()
        sys.stderr.write("\n")
        for epoch in range(2):
            print(f"epoch {epoch} done", flush=True)

    runner = HorovodRunner(
        np=32, ranks_per_task=16, launcher="direct", checkpoint_dir=str(tmp_path / "ckpt")
    )
    started = time.monotonic()
    runner.run(main)
    took = time.monotonic() - started
    out, err = capfd.readouterr()
    for epoch in range(2):
        assert _named(f"epoch {epoch} done", out) == list(range(32)), out
    assert re.search(r"^\[ranks [\d,-]+\] epoch \d done$", out, re.M), out  # collapsed
    for rank in range(32):
        assert f"[rank {rank}] rank {rank} of 32 here" in out
    bars = re.findall(r"^\[ranks? (\S+)\] \rtraining", err, re.M)
    assert bars == ["0"], err  # only rank 0's bar
    logs = Path(runner.last_job.rank_logs)
    assert _rank_logs(err) == logs and logs.name == "attempt-1"
    assert sorted(p.name for p in logs.iterdir()) == sorted(f"rank-{r}.log" for r in range(32))
    for rank in range(32):
        lines = _lines(logs / f"rank-{rank}.log")
        assert sorted(lines) == sorted(
            [
                f"rank {rank} of 32 here",
                "\rtraining: 0%|\rtraining: 25%|#\rtraining: 50%|##\rtraining: 75%|###"
                "\rtraining: 100%|####",
                "epoch 0 done",
                "epoch 1 done",
            ]
        ), lines
    # kept with the checkpoints too (copied at the attempt's end)
    copy = tmp_path / "ckpt" / "logs" / logs.parent.name / "attempt-1"
    assert f"[sparkdist] each rank's full output, copied: {copy}" in err
    for rank in (0, 31):
        assert (copy / f"rank-{rank}.log").read_bytes() == (logs / f"rank-{rank}.log").read_bytes()
    assert_nothing_left(runner, {"supervisor", "rank"})
    print(
        f"np=32 job: {took:.1f} s, {sum(p.stat().st_size for p in logs.iterdir())} bytes "
        f"in {len(list(logs.iterdir()))} rank files"
    )


def test_log_callback_only_shows_only_log_to_driver_lines_collapsed(sc, capfd):
    """`driver_log_verbosity="log_callback_only"` keeps its meaning with the collapsing
    console: the ranks' own prints stay on the ranks, `log_to_driver` lines show (collapsed
    when many ranks send the same) and fill the per-rank files, and a failure still comes
    back with its traceback."""

    def main():
        import os

        import sparkdist
        from sparkdist.protocol.driver_channel import driver_client

        rank = int(os.environ["RANK"])
        print(f"rank {rank} prints this on the rank only", flush=True)
        sparkdist.log_to_driver("data loaded")
        sparkdist.log_to_driver(f"rank {rank} has shard {rank}")
        client = driver_client()
        client.put(f"logged-{rank}", True)
        for other in range(8):
            client.get(f"logged-{other}")
        if rank == 5:
            raise ValueError("rank 5 found a bad shard")

    runner = HorovodRunner(
        np=8, ranks_per_task=4, launcher="direct", driver_log_verbosity="log_callback_only"
    )
    with pytest.raises(RankFailedError) as failed:
        runner.run(main)
    assert "ValueError: rank 5 found a bad shard" in str(failed.value)
    out, err = capfd.readouterr()
    assert "prints this on the rank only" not in out + err
    assert _named("data loaded", out) == list(range(8)), out
    assert re.search(r"^\[ranks [\d,-]+\] data loaded$", out, re.M), out
    for rank in range(8):
        assert f"[rank {rank}] rank {rank} has shard {rank}" in out
    logs = Path(runner.last_job.rank_logs)
    for rank in range(8):
        # A rank still in its rendezvous reads when rank 5 raised (they are sequential
        # round trips: one rank may finish them first) has its stacks kept after them.
        lines = _lines(logs / f"rank-{rank}.log")
        stacks = lines.index(STACKS_KEPT) if STACKS_KEPT in lines else len(lines)
        assert lines[:stacks] == ["data loaded", f"rank {rank} has shard {rank}"], lines
