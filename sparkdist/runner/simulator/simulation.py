"""The simulator's driver side, in the measuring process: the job's real `JobState` and
`DriverService` (built as the barrier kind's `form` builds them, without Spark), and
worker processes (`hosts.serve`) that hold the simulated hosts. `Simulation` runs a job
phase by phase, timing each and counting what the driver sent; `measure` runs a whole
job and returns one `Measurement`.

The driver's CPU is this process's (`time.process_time`): the service, the job's state
and its console run here, the simulated peers do not. Its memory and threads are
sampled while the job runs (`Sampler`), its bytes sent counted where they arrive.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TextIO

import psutil

from sparkdist.protocol import wire
from sparkdist.runner.driver.console import Console
from sparkdist.runner.driver.job_spec import JobSpec
from sparkdist.runner.driver.job_state import JobState
from sparkdist.runner.driver.service import DriverService
from sparkdist.runner.simulator.hosts import LinePlan, WorkerPlan, host_name, serve

LOCAL_HOST = "127.0.0.1"
WORKERS = 4
PHASE_TIMEOUT_S = 600.0
SMALL_PAYLOAD = 1 << 10
"""The job's payload while it forms: a small function's size."""


class CountingConsole(Console):
    """The driver's real console, counting the rank lines it was given (to know when the
    driver has handled every line streamed)."""

    def __init__(self, stdout: TextIO, stderr: TextIO, log_dir: str):
        super().__init__(stdout, stderr, log_dir=log_dir)
        self.rank_lines = 0
        self._counted = threading.Condition()
        self._awaited = float("inf")

    def write(self, stream: str, line: str) -> None:
        super().write(stream, line)
        if line.startswith("[rank "):
            with self._counted:
                self.rank_lines += 1
                if self.rank_lines >= self._awaited:  # wake the waiter once, not per line
                    self._counted.notify_all()

    def wait_lines(self, count: int, timeout_s: float) -> None:
        with self._counted:
            self._awaited = count
            if not self._counted.wait_for(lambda: self.rank_lines >= count, timeout_s):
                raise TimeoutError(f"the driver handled {self.rank_lines} of {count} lines")


class Sampler:
    """This process's largest RSS and thread count while the job runs (its own thread
    left out)."""

    def __init__(self, every_s: float = 0.02):
        self._process = psutil.Process()
        self._every_s = every_s
        self._stop = threading.Event()
        self.rss = 0
        self.threads = 0
        self._thread = threading.Thread(target=self._run, name="simulator-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            self.sample()

    def sample(self) -> None:
        self.rss = max(self.rss, self._process.memory_info().rss)
        self.threads = max(self.threads, self._process.num_threads() - 1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


@dataclass
class Measurement:
    """What one simulated job cost the driver."""

    ranks: int
    hosts: int
    form_s: float = 0.0
    payload_s: dict[int, float | None] = field(default_factory=dict)
    """Seconds to form a job of that payload size (None: not measured)."""
    payload_bytes: dict[int, int] = field(default_factory=dict)
    """What the driver sent while forming it."""
    lines_s: float = 0.0
    collect_s: float = 0.0
    cpu_s: float = 0.0
    phase_cpu_s: dict[str, float] = field(default_factory=dict)
    """The driver's CPU seconds by phase: form, lines, collect, payloads."""
    rss_mb: float = 0.0
    threads: int = 0
    """The most threads this process ran during the job (the sampler's left out)."""
    threads_before: int = 0
    """This process's threads before the job's service started."""
    sent_bytes: int = 0

    @property
    def cpu_ms_per_rank(self) -> float:
        return 1000 * self.cpu_s / self.ranks


class Simulation:
    """One simulated job: its driver's real state and service here, its `hosts` hosts of
    `ranks // hosts` ranks each in `workers` worker processes."""

    def __init__(
        self,
        ranks: int,
        hosts: int,
        workers: int = WORKERS,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
        log_dir: str | None = None,
        tls: bool = True,
        payload: int = SMALL_PAYLOAD,
    ):
        if ranks <= 0 or hosts <= 0 or ranks % hosts:
            raise ValueError(f"{ranks} ranks do not split evenly over {hosts} hosts")
        self.threads_before = psutil.Process().num_threads()
        """This process's threads before the job's: what a test process or a Spark session
        already runs is not the driver's cost."""
        self.ranks, self.hosts = ranks, hosts
        self._own_dir = log_dir is None
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="sparkdist-simulator-")
        sink = io.StringIO() if stdout is None else stdout
        self.console = CountingConsole(sink, stderr or sink, os.path.join(self.log_dir, "ranks"))
        secret = wire.new_secret(tls)
        self.payload = payload
        job = JobSpec(
            uuid.uuid4().hex[:12], ranks, b"p" * payload, True, "all", ranks_per_task=ranks // hosts
        )
        self.state = JobState(job, console=self.console)
        self.service = DriverService(self.state, secret, LOCAL_HOST, LOCAL_HOST)
        self.sent_bytes = 0
        self._workers: list = []
        try:
            self._start_workers(workers, secret, ranks // hosts)
        except BaseException:
            self.close()
            raise

    def _start_workers(self, count: int, secret: wire.JobSecret, per_host: int) -> None:
        context = multiprocessing.get_context("spawn")
        workers = self._workers
        count = min(count, self.hosts)
        for shard in range(count):
            hosts = tuple(range(shard, self.hosts, count))
            plan = WorkerPlan(self.service.address, secret, hosts, per_host)
            ours, theirs = context.Pipe()
            process = context.Process(
                target=serve, args=(theirs, plan), daemon=True, name=f"simulated-hosts-{shard}"
            )
            process.start()
            workers.append((process, ours))
        for process, conn in workers:
            self._answer(process, conn)

    def _answer(self, process, conn) -> int:
        if not conn.poll(PHASE_TIMEOUT_S):
            raise TimeoutError(f"{process.name} did not answer in {PHASE_TIMEOUT_S:.0f}s")
        try:
            status, value = conn.recv()
        except EOFError:
            raise RuntimeError(f"{process.name} died (exit code {process.exitcode})") from None
        if status == "failed":
            raise RuntimeError(f"{process.name} failed:\n{value}")
        return value

    def phase(self, name: str, *args) -> tuple[float, int]:
        """Run one phase on every worker: (seconds, bytes the driver sent meanwhile)."""
        start = time.monotonic()
        for _, conn in self._workers:
            conn.send((name, args))
        sent = sum(self._answer(process, conn) for process, conn in self._workers)
        self.sent_bytes += sent
        return time.monotonic() - start, sent

    def form(self) -> tuple[float, int]:
        """Every task, supervisor and rank connected, every rank welcomed (given the
        job's payload) and met: (seconds, bytes the driver sent)."""
        seconds, sent = self.phase("form", self.payload)
        if not self.state.rank_records.all_started():
            raise RuntimeError(f"ranks {self.state.rank_records.not_started()} never started")
        return seconds, sent

    def stream(self, lines: LinePlan) -> float:
        """Every rank's supervisor streams `lines`; until the driver handled them all."""
        start = time.monotonic()
        expected = self.console.rank_lines + self.ranks * lines.count
        expected += 0 if lines.error_rank is None else 1
        self.phase("lines", lines)
        self.console.wait_lines(expected, PHASE_TIMEOUT_S)
        return time.monotonic() - start

    def collect(self) -> float:
        """Every rank sends its result and exits; the job succeeds and its tasks finish."""
        start = time.monotonic()
        self.phase("results")
        self.state.failures.wait(None, time.monotonic() + PHASE_TIMEOUT_S, False)
        self.state.stop("finish", "done")
        self.phase("finish")
        if not self.state.tasks.wait_done(self.hosts, PHASE_TIMEOUT_S):
            raise TimeoutError("the simulated tasks did not say they were done")
        return time.monotonic() - start

    def kill_worker(self, shard: int) -> list[str]:
        """Kill a worker process (its hosts' tasks, supervisors and ranks all die with
        it, channels cut); the names of its hosts."""
        process, _ = self._workers[shard]
        process.kill()
        process.join()
        return [host_name(h) for h in range(shard, self.hosts, len(self._workers))]

    def close(self) -> None:
        for process, conn in self._workers:
            if process.is_alive():
                try:
                    conn.send(("quit", ()))
                except OSError:
                    pass
        for process, _ in self._workers:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
        self.service.close()
        self.console.close()
        if self._own_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)


def measure(
    ranks: int,
    hosts: int,
    payload_sizes: tuple[int, ...] = (1 << 20, 100 << 20),
    payload_budget: int = 4 << 30,
    lines: LinePlan = LinePlan(1000),
    simulation: Simulation | None = None,
) -> Measurement:
    """One whole simulated job (or the given `simulation`'s, left open): form it, stream
    the lines, collect the results; then, for each payload size, a job formed with that
    payload (not measured when giving it to every rank would exceed `payload_budget`)."""
    sim = simulation or Simulation(ranks, hosts)
    row = Measurement(ranks, hosts)
    sampler = Sampler()
    cpu = time.process_time()

    def charge(phase: str) -> None:
        row.phase_cpu_s[phase] = time.process_time() - cpu - sum(row.phase_cpu_s.values())

    try:
        row.form_s, _ = sim.form()
        charge("form")
        row.lines_s = sim.stream(lines)
        charge("lines")
        row.collect_s = sim.collect()
        charge("collect")
        for size in payload_sizes:
            row.payload_s[size] = None
            if size * ranks <= payload_budget:
                row.payload_s[size], row.payload_bytes[size] = _formed_with(ranks, hosts, size)
                row.sent_bytes += row.payload_bytes[size]
        charge("payloads")
    finally:
        row.cpu_s = time.process_time() - cpu
        sampler.stop()
        row.rss_mb, row.threads = sampler.rss / 2**20, sampler.threads
        row.threads_before = sim.threads_before
        row.sent_bytes += sim.sent_bytes
        if simulation is None:
            sim.close()
    return row


def _formed_with(ranks: int, hosts: int, payload: int) -> tuple[float, int]:
    """A job formed with a payload of `payload` bytes: (seconds, bytes the driver sent)."""
    sim = Simulation(ranks, hosts, payload=payload)
    try:
        return sim.form()
    finally:
        sim.close()
