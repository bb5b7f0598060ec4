"""The temporary directories sparkdist's processes leave when SIGKILLed (issue 64's
leftovers: 1,500 `/tmp/sparkdist-*` in a day on the test machine): each names its owner
(pid and start time, `protocol/owned_dirs.py`), and the next sweep (each job's driver and
tasks run one) removes those of owners gone, with real processes:

* a SIGKILLed child's directory is swept, a live child's is kept;
* an owner file naming a live process's pid with another start time (the pid reused
  after the owner died) is the dead owner's: swept; one from another boot too;
* kept: no owner file (an older sparkdist's, or one being made), an owner in another
  pid namespace, another user's directory;
* a real job sweeps the driver's and its tasks' host (here one machine) as it starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import sparkdist
from sparkdist.protocol import owned_dirs

CHILD = """
import sys
from sparkdist.protocol import owned_dirs
print(owned_dirs.make(sys.argv[1], root=sys.argv[2] or None), flush=True)
sys.stdin.read()  # until the test closes it, or kills this process
"""


def child_with_dir(prefix: str, root: str = "") -> tuple[subprocess.Popen, Path]:
    """A real process that made a directory with `owned_dirs.make` and waits."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, prefix, root],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    return proc, Path(proc.stdout.readline().strip())


def killed(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def ended(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    proc.wait(timeout=30)


def with_owner(root: Path, name: str, owner: str) -> Path:
    directory = root / name
    directory.mkdir()
    (directory / owned_dirs.OWNER_FILE).write_text(owner)
    return directory


def test_a_killed_owners_directory_is_swept_and_a_live_ones_kept(tmp_path):
    dead, dead_dir = child_with_dir("sparkdist-stacks-", str(tmp_path))
    live, live_dir = child_with_dir("sparkdist-rsh-", str(tmp_path))
    try:
        assert dead_dir.parent == tmp_path and dead_dir.is_dir() and live_dir.is_dir()
        owner = (dead_dir / owned_dirs.OWNER_FILE).read_text().split()
        assert int(owner[0]) == dead.pid and int(owner[1]) == owned_dirs.start_ticks(dead.pid)
        killed(dead)

        assert owned_dirs.sweep(str(tmp_path)) == [str(dead_dir)]
        assert not dead_dir.exists() and live_dir.is_dir()
    finally:
        ended(live)
    assert owned_dirs.sweep(str(tmp_path)) == [str(live_dir)]  # ended without removing it


def test_a_reused_pid_is_not_the_owner(tmp_path):
    """The owner file names a live process's pid (this one's) with another start time:
    the process that made it died and its pid went to another. A directory of this very
    process (the same pid and start time) is kept."""
    pid, start, boot, namespace = owned_dirs.this_owner().split()
    reused = with_owner(tmp_path, "sparkdist-reused", f"{pid} {int(start) + 1} {boot} {namespace}")
    other_boot = with_owner(tmp_path, "sparkdist-boot", f"{pid} {start} not-this-boot {namespace}")
    mine = Path(owned_dirs.make("sparkdist-mine-", root=str(tmp_path)))

    swept = owned_dirs.sweep(str(tmp_path))
    assert sorted(swept) == sorted([str(reused), str(other_boot)])
    assert mine.is_dir()


def test_directories_it_cannot_judge_are_kept(tmp_path):
    dead, _ = child_with_dir("sparkdist-x-", str(tmp_path))
    killed(dead)
    _, start, boot, _ = owned_dirs.this_owner().split()
    no_owner = tmp_path / "sparkdist-older-version"
    no_owner.mkdir()
    elsewhere = with_owner(tmp_path, "sparkdist-ns", f"{dead.pid} {start} {boot} pid:[1]")
    garbled = with_owner(tmp_path, "sparkdist-garbled", "not an owner")
    not_text = tmp_path / "sparkdist-not-text"
    not_text.mkdir()
    (not_text / owned_dirs.OWNER_FILE).write_bytes(b"\xff\xfe")
    not_ours = tmp_path / "not-sparkdist"
    not_ours.mkdir()

    assert len(owned_dirs.sweep(str(tmp_path))) == 1  # the killed child's only
    for kept in (no_owner, elsewhere, garbled, not_text, not_ours):
        assert kept.is_dir()


@pytest.mark.skipif(os.getuid() != 0, reason="giving a directory to another user takes root")
def test_another_users_directory_is_kept(tmp_path):
    dead, theirs = child_with_dir("sparkdist-theirs-", str(tmp_path))
    killed(dead)
    os.chown(theirs, 4242, 4242)

    assert owned_dirs.sweep(str(tmp_path)) == []
    assert theirs.is_dir()


def test_the_next_job_sweeps_what_killed_processes_left(sc):
    """In the real temp dir: a SIGKILLed process's directory is gone after a job ran, a
    live one's is still there (and directories without an owner file, as every one made
    before this change, are never touched: `test_directories_it_cannot_judge_are_kept`)."""
    dead, dead_dir = child_with_dir("sparkdist-stacks-")
    live, live_dir = child_with_dir("sparkdist-stacks-")
    try:
        assert dead_dir.parent == Path(tempfile.gettempdir())
        killed(dead)

        assert sparkdist.HorovodRunner(np=1).run(_one) == 1

        assert not dead_dir.exists()
        assert live_dir.is_dir()
    finally:
        ended(live)
        owned_dirs.sweep()


def _one() -> int:
    return 1
