"""The driver's console with many ranks: identical lines collapse into one naming the
ranks, other ranks' progress bars stay off the console, a flood is cut without losing
a warning, an error or a traceback, and every rank's lines are in its own file. Unit
tests drive a real `Console` over in-memory streams; the jobs are real ranks."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

from sparkdist import HorovodRunner
from sparkdist.runner.driver.console import Console, spans


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


# --- real jobs: 8 ranks on two executors --------------------------------------------


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
