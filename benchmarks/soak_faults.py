"""The chaos soak's injector (issue 64): each fault of the schedule (soak_schedule.py)
done to the live ranks and hosts of the namespaced cluster, and undone when it ends.

Ranks are found from the job's own records (`tests/cluster/soak_job.py`: an `enter`
event per world a rank joins, with its pid and host); hosts from the cluster. What only
the job can do (a lock, a slow step, an os._exit, a death in a checkpoint write) is asked
through files in its control folder. The checkpoint store is a small tmpfs the injector
fills (`Store`). Host 0 carries the Spark master, so it is never cut off.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from soak_schedule import Fault

logger = logging.getLogger(__name__)

FULL_BYTES = 1 << 20


class Store:
    """The checkpoint store, a folder on the hosts' shared disk. Its disk is made full
    where the ranks see it: in each host's mount namespace (`ip netns exec` gives every
    host its own, and the root's mounts do not reach them) a small tmpfs is mounted over
    the folder and filled; unmounting it brings the folder, and what was saved before,
    back."""

    def __init__(self, path: Path, cluster):
        self.path = path
        self.cluster = cluster
        path.mkdir(parents=True, exist_ok=True)
        self.mounted: list[int] = []
        """The worker pids in whose mount namespace the full tmpfs is."""

    def _in(self, pid: int, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(["nsenter", "-t", str(pid), "-m", *argv], capture_output=True)

    def fill(self) -> None:
        """Mount the full tmpfs over the folder on every live host."""
        for i in range(self.cluster.state.hosts):
            if not self.cluster.alive(f"worker-{i}"):
                continue
            pid = self.cluster.state.pids[f"worker-{i}"]
            size = f"size={FULL_BYTES}"
            done = self._in(pid, "mount", "-t", "tmpfs", "-o", size, "soakfull", str(self.path))
            if done.returncode != 0:
                raise RuntimeError(f"cannot mount the full disk on host {i}: {done.stderr!r}")
            self.mounted.append(pid)
            self._in(pid, "dd", "if=/dev/zero", f"of={self.path / 'filler'}", "bs=64k")

    def free(self) -> None:
        for pid in self.mounted:
            self._in(pid, "umount", str(self.path))  # a host lost since: its namespace went too
        self.mounted.clear()

    def close(self) -> None:
        self.free()


class DriverStore:
    """The relaunch path's checkpoint store: the driver's folder
    (`HorovodRunner(checkpoint_dir=...)`; the driver runs in the root's mount namespace),
    a tmpfs of its own mounted there for the run. A filler file makes it full and its
    removal frees it: what was saved before stays in view, as on a real full disk."""

    SIZE = 64 << 20

    def __init__(self, path: Path):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        mount = ["mount", "-t", "tmpfs", "-o", f"size={self.SIZE}", "soakstore", str(path)]
        subprocess.run(mount, check=True, capture_output=True)
        self.filler = path / "filler"

    def fill(self) -> None:
        chunk = bytes(1 << 16)
        with open(self.filler, "ab", buffering=0) as f:
            try:
                while True:
                    f.write(chunk)
            except OSError:  # ENOSPC: full
                pass

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def close(self) -> None:
        self.free()
        subprocess.run(["umount", str(self.path)], capture_output=True)


def read_lines(path: Path) -> list[dict]:
    """A JSON-lines file's records (a half-written last line is not one yet)."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            pass
    return found


def same_process(pid: int, started: float) -> psutil.Process | None:
    """The rank's process if `pid` still is it (its start time, as it logged it on
    entering): pids are reused (pid_max is 32768 here), and a stopped rank's pid was
    another process's 25 minutes later, which a SIGKILL would have hit."""
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - started) > 0.05 or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.Error:
        return None


def alive(member: dict) -> bool:
    """Whether the rank that logged `member` (an `enter` event) still runs."""
    return same_process(member["pid"], member["started"]) is not None


def _signal(member: dict, sig: int) -> None:
    """Send `sig` to the rank of `member`, if it is still that process."""
    proc = same_process(member["pid"], member["started"])
    if proc is not None:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass


class World:
    """The job as its records show it: the live members and the last step."""

    def __init__(self, progress: Path):
        self.progress = progress

    def members(self) -> list[dict]:
        """The newest `enter` of each live rank process, in world-rank order."""
        newest: dict[int, dict] = {}
        for path in self.progress.glob("events-*.jsonl"):
            entered = [e for e in read_lines(path) if e["event"] == "enter"]
            if entered and alive(entered[-1]):
                newest[entered[-1]["pid"]] = entered[-1]
        if not newest:
            return []
        generation = max(e["gen"] for e in newest.values())
        return sorted(
            (e for e in newest.values() if e["gen"] == generation), key=lambda e: e["rank"]
        )

    def steps(self) -> list[dict]:
        return read_lines(self.progress / "steps.jsonl")

    def steps_of_generation(self) -> int:
        """How many steps the newest world made."""
        steps = self.steps()
        newest = world_of(steps[-1]) if steps else None
        return sum(1 for row in steps if world_of(row) == newest)

    def last_step(self) -> dict:
        steps = self.steps()
        return steps[-1] if steps else {"step": 0, "world_size": 0, "generation": -1, "at": 0.0}


def world_of(row: dict) -> tuple[int, int]:
    """(attempt, generation): which world a step ran in; a relaunch numbers its
    generations from 0 again."""
    return row.get("attempt", 0), row["generation"]


@dataclass
class Fired:
    """One fault as it was done."""

    fault: Fault
    at: float
    """time.time() when it was done."""
    target: str
    step: int
    generation: int
    skipped: str = ""
    attempt: int = 0
    dropped_at: float | None = None
    """sigstop/stuck: when the rank's process was gone."""
    ended_at: float | None = None
    notes: list[str] = field(default_factory=list)


class Injector:
    """Does each fault to the live job and undoes it when its time is up."""

    def __init__(self, cluster, progress: Path, control: Path, store: Store, scale: float):
        self.cluster = cluster
        self.world = World(progress)
        self.control = control
        self.store = store
        self.scale = scale
        self.notice_s = max(5.0, 15.0 * scale)
        """From a decommission notice to the host's loss: 15 s, scaled as the faults'
        durations are, but not below 5 s (the world has left the host within 1 s)."""
        self.down: set[int] = set()
        """Hosts whose worker was stopped (lost or decommissioned), to bring back."""
        self.cut: set[int] = set()
        self.timers: list[threading.Timer] = []
        self.threads: list[threading.Thread] = []
        """Threads that stop a host's worker: done before it is brought back."""
        self.stopped: list[dict] = []
        """The `enter` events of the ranks SIGSTOPped: each gets a SIGCONT at the end."""
        self.hosts_lost = 0
        self.lock = threading.Lock()

    def hosts_up(self) -> list[int]:
        with self.lock:
            gone = self.down | self.cut
        return [i for i in range(self.cluster.state.hosts) if i not in gone]

    def fire(self, fault: Fault, duration_s: float) -> Fired:
        """Do `fault` now (its end `duration_s` later); the record says to what."""
        last = self.world.last_step()
        fired = Fired(fault, time.time(), "", last["step"], last["generation"])
        fired.attempt = last.get("attempt", 0)
        try:
            getattr(self, f"_{fault.kind}")(fault, duration_s, fired)
        except (ValueError, RuntimeError, OSError) as exc:
            fired.skipped = str(exc)
        logger.info("fault %s -> %s %s", fault.kind, fired.target, fired.skipped)
        return fired

    def _later(self, delay_s: float, undo, fired: Fired) -> None:
        def run() -> None:
            undo()
            fired.ended_at = time.time()

        timer = threading.Timer(delay_s, run)
        timer.daemon = True
        self.timers.append(timer)
        timer.start()

    def _background(self, work) -> None:
        thread = threading.Thread(target=work, daemon=True)
        self.threads.append(thread)
        thread.start()

    def _rank(self, fault: Fault, fired: Fired) -> dict:
        member = fault.target(self.world.members())
        fired.target = f"rank {member['rank']} (pid {member['pid']}, host {member['host']})"
        return member

    def killed_tasks(self) -> int:
        """How many Spark tasks were SIGKILLed: one with each host lost (one slot a host)."""
        return self.hosts_lost

    def _host(self, fault: Fault, fired: Fired, spare_master: bool) -> int:
        hosts = [i for i in self.hosts_up() if not (spare_master and i == 0)]
        host = fault.target(hosts)
        fired.target = f"host {host} ({self.cluster.address(host)})"
        return host

    def _watch_drop(self, member: dict, until_s: float, fired: Fired) -> None:
        def watch() -> None:
            deadline = time.monotonic() + until_s
            while alive(member) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not alive(member):
                fired.dropped_at = time.time()

        threading.Thread(target=watch, daemon=True).start()

    def _touch(self, name: str, text: str = "") -> Path:
        path = self.control / name
        path.with_suffix(".tmp").write_text(text)
        os.replace(path.with_suffix(".tmp"), path)
        return path

    def stop_at(self, step: int) -> None:
        """Tell the job the step to stop at."""
        self._touch("stop-at", str(step))

    # --- the kinds -------------------------------------------------------------------

    def _sigkill(self, fault: Fault, duration_s: float, fired: Fired) -> None:
        _signal(self._rank(fault, fired), signal.SIGKILL)

    def _sigstop(self, fault: Fault, duration_s: float, fired: Fired) -> None:
        member = self._rank(fault, fired)
        _signal(member, signal.SIGSTOP)
        self.stopped.append(member)
        self._watch_drop(member, duration_s + 30, fired)
        self._later(duration_s, lambda: _signal(member, signal.SIGCONT), fired)

    def _stuck(self, fault: Fault, duration_s: float, fired: Fired) -> None:
        member = self._rank(fault, fired)
        path = self._touch(f"stuck-{member['pid']}")
        self._watch_drop(member, duration_s + 30, fired)
        self._later(duration_s, lambda: path.unlink(missing_ok=True), fired)

    def _exit(self, fault: Fault, duration_s: float, fired: Fired) -> None:
        how = "segv" if fault.pick % 2 else "exit"
        pid = self._rank(fault, fired)["pid"]
        fired.notes.append(how)
        self._touch(f"exit-{pid}", how)

    def _slow_rank(self, fault: Fault, duration_s: float, fired: Fired) -> None:
        path = self._touch(f"slow-{self._rank(fault, fired)['pid']}")
        self._later(duration_s, lambda: path.unlink(missing_ok=True), fired)

    def _in_checkpoint(self, fault: Fault, duration_s: float, fired: Fired) -> None:
        fired.target = "world rank 0, in its next checkpoint write"
        self._touch("die-in-save")

    def _disk_full(self, fault: Fault, duration_s: float, fired: Fired) -> None:
        fired.target = f"checkpoint store {self.store.path}"
        self.store.fill()
        self._later(duration_s, self.store.free, fired)

    def _cut_host(self, fault: Fault, duration_s: float, fired: Fired) -> None:
        host = self._host(fault, fired, spare_master=True)
        with self.lock:
            self.cut.add(host)
        self.cluster.set_link(host, up=False)
        self._later(duration_s, lambda: self._relink(host), fired)

    def _relink(self, host: int) -> None:
        with self.lock:
            if host not in self.cut:
                return
            self.cut.discard(host)
        self.cluster.set_link(host, up=True)

    def _lose_host(self, fault: Fault, duration_s: float, fired: Fired) -> None:
        host = self._host(fault, fired, spare_master=False)
        with self.lock:
            self.down.add(host)
            self.hosts_lost += 1
        self._background(lambda: self.cluster.stop_worker(host))

    def _notice(self, fault: Fault, duration_s: float, fired: Fired) -> None:
        host = self._host(fault, fired, spare_master=False)
        with self.lock:
            self.down.add(host)
            self.hosts_lost += 1
        self.cluster.decommission_worker(host)

        def kill_later() -> None:
            time.sleep(self.notice_s)
            self.cluster.stop_worker(host)

        self._background(kill_later)

    def _grow(self, fault: Fault, duration_s: float, fired: Fired) -> None:
        with self.lock:
            down = sorted(self.down)
        if not down:
            raise ValueError("no host is down: nothing to grow into")
        host = fault.target(down)
        fired.target = f"host {host} ({self.cluster.address(host)}) back"
        self.bring_back(host)

    # --- undoing ---------------------------------------------------------------------

    def bring_back(self, host: int) -> None:
        """Start host's worker again, once what stopped it is done."""
        for thread in self.threads:
            thread.join(timeout=120)
        with self.lock:
            if host not in self.down:
                return
            self.down.discard(host)
        if not self.cluster.alive(f"worker-{host}"):
            self.cluster.start_worker(host)

    def heal(self) -> None:
        """Undo every fault still in force, now: hosts back, links up, files gone."""
        for timer in self.timers:
            timer.cancel()
        for host in sorted(self.cut):
            self._relink(host)
        for host in sorted(self.down):
            self.bring_back(host)
        self.store.free()
        for path in self.control.iterdir():
            if path.name != "stop-at":
                path.unlink(missing_ok=True)
        for member in self.stopped:
            _signal(member, signal.SIGCONT)
