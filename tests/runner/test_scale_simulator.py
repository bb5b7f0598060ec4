"""The driver at 256 ranks, without Spark: its real service and job state, and 256
simulated ranks on 32 simulated hosts (`sparkdist.runner.simulator`) that speak the real
protocol (TLS, HMAC, the real messages) from four worker processes.

One simulated job is shared by the module (it forms, gets a 1 MB payload, floods the
console and finishes); the killed task has a small job of its own.
"""

from __future__ import annotations

import io
import pickle
import re
import time

import pytest

from sparkdist.errors import RankFailedError
from sparkdist.runner.simulator.hosts import LinePlan
from sparkdist.runner.simulator.simulation import Measurement, Simulation, measure

RANKS, HOSTS = 256, 32
PAYLOAD = 1 << 20
THREAD_BOUND = 32
ERROR = "ERROR: rank 200 saw a bad batch"
FLOOD = LinePlan(1000, rate=1000.0, error_rank=200, error=ERROR)
"""1,000 lines a second from every rank for a second; rank 200's error among them."""


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> tuple[Simulation, Measurement, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    sim = Simulation(
        RANKS, HOSTS, stdout=out, stderr=err, log_dir=str(tmp_path_factory.mktemp("simulated"))
    )
    try:
        row = measure(RANKS, HOSTS, (PAYLOAD,), lines=FLOOD, simulation=sim)
        sim.console.flush()
        yield sim, row, out, err
    finally:
        sim.close()


def test_the_world_forms_and_every_result_is_collected(job):
    sim, row, _, _ = job
    assert sim.state.rank_records.all_started()
    assert [pickle.loads(blob) for blob in sim.state.rank_records.results()] == list(range(RANKS))
    assert sim.state.succeeded()
    assert sim.state.tasks.done == set(range(HOSTS))
    assert {sim.state.ranks[r].host for r in (0, 255)} == {"sim-host-0", "sim-host-31"}
    print(
        f"\n256 ranks: formed in {row.form_s:.2f}s, collected in {row.collect_s:.2f}s, "
        f"driver CPU {row.cpu_s:.2f}s, {row.threads} threads, {row.rss_mb:.0f} MB"
    )


def test_the_driver_threads_stay_under_the_bound(job):
    _, row, _, _ = job
    job_threads = row.threads - row.threads_before  # pytest's and an earlier Spark's left out
    assert job_threads <= THREAD_BOUND, f"the driver's job ran {job_threads} threads at 256 ranks"


def test_the_payload_is_sent_once_per_simulated_host(job):
    _, row, _, _ = job
    sent = row.payload_bytes[PAYLOAD]
    assert sent == pytest.approx(PAYLOAD * HOSTS, rel=0.01), (
        f"the driver sent {sent / PAYLOAD:.1f} payloads of 1 MB for {HOSTS} hosts"
    )


def test_an_error_line_in_a_flood_reaches_the_console(job):
    _, _, out, err = job
    assert f"[rank 200] {ERROR}" in err.getvalue().splitlines()
    shown = [line for line in out.getvalue().splitlines() if line.startswith("[rank")]
    assert 0 < len(shown) < RANKS * FLOOD.count  # rate limited
    assert re.search(r"^\[sparkdist\] \d+ lines of ranks \S+ not shown", err.getvalue(), re.M)


def test_a_killed_task_fails_the_job_as_a_lost_task():
    """A simulated host's process killed mid-job: its task's, supervisors' and ranks'
    channels are cut, and the job fails as when an executor dies."""
    sim = Simulation(8, 4, workers=4)
    try:
        sim.form()
        assert sim.kill_worker(3) == ["sim-host-3"]
        with pytest.raises(RankFailedError) as failed:
            sim.state.failures.wait(None, time.monotonic() + 60, launcher_expected=False)
        error = failed.value
        assert error.rank in (6, 7) and error.host == "sim-host-3"
        assert "lost contact with" in str(error).splitlines()[0]
        cause = sim.state.failures.outside_user_code()
        assert cause.startswith("rank 6 on host sim-host-3: lost contact with Spark task 3"), cause
        assert "its executor died, or the host or its network was lost" in cause
    finally:
        sim.close()
