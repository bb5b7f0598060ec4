"""Relaunching failed jobs from a checkpoint (`max_failures`, `sparkdist.checkpoint`) on
real Spark (local-cluster): a rank killed mid-training, the job resumes from rank 0's
last checkpoint and ends with the same model as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from cluster.jobs import resumable_main

from sparkdist import HorovodRunner, RankFailedError
from sparkdist.checkpoint.driver.store import CheckpointStore

EPOCHS = 8


def kill_rank_at(progress_dir: Path, rank: int, epoch: int, killed: list) -> threading.Thread:
    """Kill `rank` with SIGKILL once its first attempt has finished `epoch` epochs."""

    def watch() -> None:
        path = progress_dir / f"rank-{rank}.json"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                seen = json.loads(path.read_text())
            except (OSError, ValueError):
                seen = None
            if seen and seen["attempt"] == 0 and seen["epoch"] >= epoch:
                os.kill(seen["pid"], signal.SIGKILL)
                killed.append(seen)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_killed_rank_resumes_from_checkpoint_and_matches_uninterrupted(sc, tmp_path):
    clean = HorovodRunner(np=2, start_timeout=120).run(
        resumable_main, epochs=EPOCHS, progress_dir=str(tmp_path), epoch_s=0.0
    )
    assert clean["history"] == list(range(1, EPOCHS + 1)) and clean["resumed_from"] == 0

    progress = tmp_path / "interrupted"
    progress.mkdir()
    killed: list = []
    watcher = kill_rank_at(progress, rank=1, epoch=3, killed=killed)
    runner = HorovodRunner(np=2, start_timeout=120, max_failures=2)
    result = runner.run(resumable_main, epochs=EPOCHS, progress_dir=str(progress), epoch_s=0.4)
    watcher.join(timeout=5)

    assert killed and killed[0]["epoch"] >= 3
    report = runner.last_job
    assert report.attempts == 2 and report.outcome == "succeeded"
    assert "rank 1" in report.failures[0] and "SIGKILL" in report.failures[0]
    # Resumed from a checkpoint of the first attempt, not from scratch, and every epoch
    # was trained exactly once in the model's history.
    assert result["attempt"] == 1
    assert 3 <= result["resumed_from"] < EPOCHS
    assert result["history"] == list(range(1, EPOCHS + 1))
    # As good as the uninterrupted run: the same model.
    assert result["weights"] == pytest.approx(clean["weights"], abs=1e-5)
    assert result["loss"] == pytest.approx(clean["loss"], rel=1e-4, abs=1e-6)
    alive = [r for r in report.processes if r.alive()]
    assert alive == []


def failing_main(fail_attempts: int) -> int:
    from sparkdist import checkpoint

    if checkpoint.attempt() < fail_attempts:
        raise ValueError(f"bad data on attempt {checkpoint.attempt()}")
    return checkpoint.attempt()


def test_exception_in_user_code_is_not_retried(sc):
    runner = HorovodRunner(np=2, max_failures=3)
    with pytest.raises(RankFailedError, match="bad data on attempt 0"):
        runner.run(failing_main, fail_attempts=1)
    assert runner.last_job.attempts == 1 and runner.last_job.failures == []


def test_exception_retried_when_asked(sc):
    runner = HorovodRunner(np=2, max_failures=1, retry_on_exception=True)
    assert runner.run(failing_main, fail_attempts=1) == 1
    assert runner.last_job.attempts == 2
    assert "ValueError: bad data on attempt 0" in runner.last_job.failures[0]
    # The limit holds: two failing attempts with one relaunch allowed fail the job.
    with pytest.raises(RankFailedError, match="bad data on attempt 1"):
        runner.run(failing_main, fail_attempts=2)
    assert runner.last_job.attempts == 2


def preemptible_main(marker_dir: str) -> int:
    """Attempt 0: rank 1 names its supervisor and waits for SIGTERM, which it handles
    as a preemption-aware trainer does (record it, then die of the signal). Later
    attempts return their number."""
    import os
    import signal
    import time
    from pathlib import Path

    from sparkdist import checkpoint

    markers = Path(marker_dir)
    if checkpoint.attempt() > 0 or os.environ["RANK"] != "1":
        return checkpoint.attempt()

    def on_sigterm(signum, frame):
        (markers / "rank-1-got-sigterm").write_text(str(os.getpid()))
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
    (markers / "supervisor.pid.new").write_text(str(os.getppid()))
    os.replace(markers / "supervisor.pid.new", markers / "supervisor.pid")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.05)
    raise TimeoutError("SIGTERM did not arrive")


@pytest.mark.parametrize("launcher", ["mpi", "direct"])
def test_sigterm_to_supervisor_reaches_rank_and_is_retried(sc, tmp_path, launcher):
    """A SIGTERM to a rank's supervisor (an operator, a host being decommissioned)
    reaches the rank, whose end by that signal is reported as such and relaunched as
    a failure outside the training code."""
    sent: list[int] = []

    def terminate_supervisor() -> None:
        path = tmp_path / "supervisor.pid"
        deadline = time.monotonic() + 120
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = int(path.read_text())
        os.kill(pid, signal.SIGTERM)
        sent.append(pid)

    watcher = threading.Thread(target=terminate_supervisor, daemon=True)
    watcher.start()
    runner = HorovodRunner(np=2, launcher=launcher, start_timeout=120, max_failures=1)
    assert runner.run(preemptible_main, marker_dir=str(tmp_path)) == 1
    watcher.join(timeout=5)

    assert sent, "the test never found rank 1's supervisor"
    assert (tmp_path / "rank-1-got-sigterm").exists()
    report = runner.last_job
    assert report.attempts == 2 and report.outcome == "succeeded"
    assert "rank 1" in report.failures[0] and "SIGTERM" in report.failures[0]
    assert [r for r in report.processes if r.alive()] == []


def test_checkpoint_store_keeps_newest_and_named_directory(tmp_path):
    store = CheckpointStore(tmp_path / "ckpt", keep=2)
    assert store.latest() is None
    for step in (1, 2, 3):
        store.save(step, f"state {step}".encode())
    assert store.steps() == [2, 3]
    assert store.latest() == (3, b"state 3")
    with pytest.raises(ValueError, match="step"):
        store.save(-1, b"x")
    store.close()
    assert store.latest() == (3, b"state 3")  # a directory the user named is kept
    temporary = CheckpointStore()
    temporary.save(0, b"x")
    temporary.close()
    assert not temporary.directory.exists()


def test_checkpoint_outside_a_rank_says_where_it_works():
    from sparkdist import checkpoint

    with pytest.raises(RuntimeError, match="inside a rank started by HorovodRunner"):
        checkpoint.latest()


def test_invalid_max_failures():
    with pytest.raises(ValueError, match="max_failures"):
        HorovodRunner(np=2, max_failures=-1)


def test_checkpoint_store_on_a_url_filesystem():
    # Relay mode keeps checkpoints where barrier task 0 can write them: any URL pyarrow or
    # fsspec opens. fsspec's in-memory file system stands for s3://, dbfs:/ and the like.
    store = CheckpointStore("memory://sparkdist-test/run-1", keep=1)
    assert store.latest() is None
    store.save(4, b"four")
    store.save(5, b"five")
    assert store.steps() == [5]
    assert CheckpointStore("memory://sparkdist-test/run-1").latest() == (5, b"five")


def returns_one():
    return 1


def test_mpirun_that_cannot_start_is_launched_once_more_then_reported(sc):
    """Open MPI's start-up failing before any rank started ("orte_session_dir failed") is
    launched once more without counting against max_failures; failing again, the job
    reports Open MPI's own words."""
    from sparkdist import JobFailedError

    runner = HorovodRunner(
        np=2, launcher="mpi", mpi_args=["--mca", "orte_tmpdir_base", "/proc/sparkdist-absent"]
    )
    with pytest.raises(JobFailedError, match="mpirun exited") as caught:
        runner.run(returns_one)
    assert "orte_session_dir failed" in "\n".join(caught.value.output_tail)
    assert runner.last_job.attempts == 2
    assert runner.last_job.failures == ["mpirun could not start its daemons"]


def daemon_session_dir() -> dict:
    """This rank's task directory, the orte_tmpdir_base its orted was started with, the
    one of mpirun if it runs in this rank's task, and the topology file orted read."""
    import psutil

    given = mpirun_dir = topology = None
    for process in psutil.Process().parents():
        argv = process.cmdline()
        if argv and os.path.basename(argv[0]) == "orted":
            given = argv[argv.index("orte_tmpdir_base") + 1]
            topology = process.environ().get("HWLOC_XMLFILE")
            for sibling in process.parent().children():  # the task's Python worker's
                if sibling.name() == "mpirun":
                    mpirun_dir = sibling.environ()["OMPI_MCA_orte_tmpdir_base"]
            break
    with open(topology, "rb") as f:
        machine = b'type="Machine"' in f.read()
    return {
        "task_dir": os.environ["OMPI_MCA_orte_tmpdir_base"],
        "orted_dir": given,
        "mpirun_dir": mpirun_dir,
        "topology_in_task_dir": os.path.dirname(topology) == given,
        "topology_has_machine": machine,
    }


def test_each_task_daemon_keeps_its_session_in_its_own_task_directory(sc):
    """mpirun tells every orted to use its own directory, and a starting orted clears its
    job's session tree there; the task agent starts its orted with its own task's
    directory instead, and mpirun's is neither. Each orted reads the host's topology
    from a file in its task's directory."""
    first, second = HorovodRunner(np=2, launcher="mpi").run_all(daemon_session_dir)
    # Every task's ranks run under an orted its agent started (mpirun runs none itself).
    assert first["orted_dir"] == first["task_dir"]
    assert second["orted_dir"] == second["task_dir"] != first["task_dir"]
    assert first["mpirun_dir"] not in (None, first["task_dir"], second["task_dir"])
    assert second["mpirun_dir"] is None  # task 1 runs no mpirun
    for rank in (first, second):
        assert rank["topology_in_task_dir"] and rank["topology_has_machine"]
