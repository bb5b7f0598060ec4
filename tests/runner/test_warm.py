"""Warm worlds (`HorovodRunner(keep_warm=...)`): real Spark (local-cluster, two
executors), real ranks, real torch.distributed over Gloo, kept between runs."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
from helpers import interrupt_once_ranks_ran, pid_alive

from sparkdist import HorovodRunner, JobTimeoutError, RankFailedError
from sparkdist.protocol import messages, wire
from sparkdist.runner.driver import warm
from sparkdist.runner.rank.warm import RefusedRun, check_order
from sparkdist.trace import format, validate

MODULE = "xml.dom.minidom"
"""A module neither sparkdist nor torch imports: the first run does."""


def where_am_i(x, import_it=False):
    """Each rank's pid, its argument, whether MODULE was imported before this run, and
    an allreduce over a process group the run leaves up (the world takes it down)."""
    import importlib
    import os
    import sys

    import torch
    import torch.distributed as dist

    had = MODULE in sys.modules
    if import_it:
        importlib.import_module(MODULE)
    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    return {
        "pid": os.getpid(),
        "x": x,
        "had": had,
        "sum": value.item(),
        "job": os.environ["SPARKDIST_JOB_ID"],
        "port": os.environ["MASTER_PORT"],
    }


def elastic_steps(steps, kill_rank=None):
    """In-process elastic code: `elastic.run` trains `steps` steps, committing each;
    the rank's pid, the steps done and the elastic world's size. Launch rank
    `kill_rank` dies of SIGKILL after its second commit."""
    import os
    import signal

    import torch
    import torch.distributed as dist

    from sparkdist import elastic

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    @elastic.run
    def train(state):
        while state.step < steps:
            optimizer.zero_grad()
            model(torch.ones(2, 4)).sum().backward()
            for parameter in model.parameters():
                dist.all_reduce(parameter.grad)
            optimizer.step()
            state.step += 1
            state.commit()
            if state.step == 2 and os.environ["RANK"] == str(kill_rank):
                os.kill(os.getpid(), signal.SIGKILL)
        return state.step, dist.get_world_size()

    state = elastic.TorchState(model=model, optimizer=optimizer, step=0)
    return os.getpid(), *train(state)


def fails():
    raise ValueError("this run fails")


def pid():
    import os

    return os.getpid()


def stuck(path):
    """Say it runs (a file per rank, holding its pid), then wait for ever, silently."""
    import os

    with open(f"{path}.{os.environ['RANK']}", "w") as f:
        f.write(str(os.getpid()))
    threading.Event().wait()


def _gone(pids, timeout_s=30.0) -> list[int]:
    """Those of `pids` still alive after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if pid_alive(p)]
        if alive:
            time.sleep(0.1)
    return alive


def _wait_released(world: warm.WarmWorld, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while world.usable or world._thread.is_alive():
        assert time.monotonic() < deadline, world.describe()
        time.sleep(0.1)


@pytest.mark.parametrize(
    "np_, launcher", [(-2, "direct"), (2, "direct"), (2, "mpi")], ids=["driver", "direct", "mpi"]
)
def test_two_runs_on_one_warm_world_share_their_processes(sc, np_, launcher):
    with HorovodRunner(np=np_, launcher=launcher, keep_warm=120, start_timeout=120) as runner:
        first = runner.run_all(where_am_i, x=1, import_it=True)
        first_job = runner.last_job
        again = HorovodRunner(np=np_, launcher=launcher, keep_warm=120)
        second = again.run_all(where_am_i, x=2)
        assert [r["x"] for r in first] == [1, 1] and [r["x"] for r in second] == [2, 2]
        assert [r["sum"] for r in first + second] == [3.0] * 4
        # The same processes, with what the first run imported, in a new job environment.
        assert [r["pid"] for r in second] == [r["pid"] for r in first]
        assert [r["had"] for r in first] == [False, False]
        assert [r["had"] for r in second] == [True, True]
        assert first[0]["job"] != second[0]["job"]
        assert first[0]["port"] != second[0]["port"]
        assert first_job.outcome == "succeeded"
        # A run's trace is its world's so far: both runs, on the driver's job lane.
        assert first_job.trace == again.last_job.trace
        trace = json.loads(Path(again.last_job.trace).read_text())
        validate.check(trace)
        runs = [
            e["name"]
            for e in trace["traceEvents"]
            if (e["ph"], e["pid"], e["tid"]) == ("X", format.DRIVER, format.JOB)
            and e["name"].startswith("run ")
        ]
        assert runs == [f"run {first_job.job_id}", f"run {again.last_job.job_id}"]
        pids = [r["pid"] for r in first]
    assert _gone(pids) == []  # closed: the ranks end


def test_in_process_elastic_code_runs_again_on_a_warm_world():
    """Each run's elastic world meets at its own rendezvous keys: the second run's does
    not read the first run's (gone) store address."""
    with HorovodRunner(np=-2, launcher="direct", keep_warm=120) as runner:
        first = runner.run_all(elastic_steps, steps=3)
        second = runner.run_all(elastic_steps, steps=5)
    assert [steps for _, steps, _ in first] == [3, 3]
    assert [(steps, size) for _, steps, size in second] == [(5, 2), (5, 2)]
    assert [pid for pid, _, _ in second] == [pid for pid, _, _ in first]


def checkpointed_steps(kill: bool):
    """Three steps, rank 0 saving each; with `kill`, rank 0 dies of SIGKILL at step 2 of
    its run's first attempt (a loss outside `main`, as a lost executor's)."""
    import os
    import signal

    from sparkdist import checkpoint

    found = checkpoint.resume()
    step = found.step if found else 0
    while step < 3:
        step += 1
        if kill and step == 2 and checkpoint.attempt() == 0 and os.environ["RANK"] == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        checkpoint.save({"step": step}, step)
    return {
        "pid": os.getpid(),
        "attempt": checkpoint.attempt(),
        "resumed": found.step if found else None,
    }


def test_an_elastic_world_relaunches_within_a_run_and_stays_warm(sc, caplog):
    """An elastic warm world (min_np/max_np) that loses a rank mid-run relaunches, as an
    elastic job does: its new ranks take the run in progress and resume from that run's
    checkpoint. The next run finds the new ranks warm, with a store of its own (nothing
    to resume) and its own attempt count."""
    options = dict(np=2, min_np=1, max_np=2, launcher="direct", keep_warm=120)
    with HorovodRunner(**options, start_timeout=120) as runner:
        with caplog.at_level(logging.WARNING, logger="sparkdist"):
            first = runner.run_all(checkpointed_steps, kill=True)
        relaunched = runner.last_job
        second = HorovodRunner(**options).run_all(checkpointed_steps, kill=False)
        world = warm.current()
        assert world is not None and world.dispatch.attempt == 1
    assert [r["attempt"] for r in first] == [1, 1]
    assert first[0]["resumed"] == 1  # rank 0 saved step 1, then died
    assert relaunched.outcome == "succeeded"
    relaunches = [r.getMessage() for r in caplog.records if "SIGKILL" in r.getMessage()]
    assert len(relaunches) == 1 and "resuming from step 1" in relaunches[0], caplog.text
    assert [r["pid"] for r in second] == [r["pid"] for r in first]  # kept warm
    assert [r["attempt"] for r in second] == [0, 0]
    # Nothing of the first run's store to resume. Rank 0's answer is the one to read: it
    # asks before it saves anything, while rank 1 (no collective holds it back here) may
    # ask after rank 0 saved this run's step 1, and then resume from it (it did, once).
    assert second[0]["resumed"] is None
    assert _gone([r["pid"] for r in second]) == []


def test_an_elastic_world_in_process_goes_on_without_a_lost_rank_and_stays_warm(sc):
    """In-process elastic code on an elastic warm world: a rank lost mid-run is dropped
    from the running world (no relaunch); the run ends when the survivors did, and the
    next run takes the survivors, in their processes."""
    options = dict(np=4, min_np=2, max_np=4, ranks_per_task=2, keep_warm=120)
    with HorovodRunner(**options, start_timeout=120) as runner:
        first = runner.run_all(elastic_steps, steps=4, kill_rank=3)
        job = runner.last_job
        second = runner.run_all(elastic_steps, steps=2)
        plain = runner.run_all(where_am_i, x=3)  # RANK and WORLD_SIZE: the members'
    assert [(steps, size) for _, steps, size in first] == [(4, 3)] * 3
    assert job.attempts == 1 and job.failures == []
    assert [(steps, size) for _, steps, size in second] == [(2, 3)] * 3
    pids = [pid for pid, _, _ in first]
    assert [pid for pid, _, _ in second] == pids
    assert [(r["pid"], r["sum"]) for r in plain] == [(p, 6.0) for p in pids]  # 1 + 2 + 3
    assert _gone(pids) == []


def test_a_failed_run_ends_its_world_and_the_next_starts_afresh(sc):
    runner = HorovodRunner(np=2, keep_warm=120, start_timeout=120)
    try:
        before = runner.run_all(pid)
        with pytest.raises(RankFailedError) as failed:
            runner.run(fails)
        assert "ValueError: this run fails" in str(failed.value)
        assert "Traceback" in str(failed.value)
        assert _gone(before) == []
        after = runner.run_all(pid)
        assert set(after).isdisjoint(before)
    finally:
        runner.close()


def test_idle_world_releases_its_slots_for_the_next_job(sc):
    runner = HorovodRunner(np=2, keep_warm=3, start_timeout=120)
    pids = runner.run_all(pid)
    world = warm.current()
    assert world is not None
    _wait_released(world)
    assert _gone(pids) == []
    # Both of the cluster's two slots are free again: a plain job of two ranks gets them
    # (a barrier stage that did not get both would end in its start timeout's error).
    plain = HorovodRunner(np=2, start_timeout=60)
    assert len(set(plain.run_all(pid))) == 2 and plain.last_job.outcome == "succeeded"


def test_a_run_of_another_shape_releases_the_world(sc, caplog):
    with HorovodRunner(np=-2, keep_warm=120) as two:
        pids = two.run_all(pid)
        with caplog.at_level(logging.WARNING, logger="sparkdist"):
            with HorovodRunner(np=-1, keep_warm=120) as one:
                other = one.run_all(pid)
        assert "a run of another shape" in caplog.text
        assert _gone(pids) == []
        assert set(other).isdisjoint(pids)


def test_a_payload_signed_for_another_run_is_refused():
    secret = wire.new_secret()
    signed = secret.run_tag("job-1", b"payload")
    first = messages.WarmRun(1, "job-1", b"payload", signed, True)
    check_order(first, 0, secret)  # the run's own signature
    with pytest.raises(RefusedRun, match="not signed"):
        check_order(messages.WarmRun(2, "job-2", b"payload", signed, True), 1, secret)
    with pytest.raises(RefusedRun, match="next run is 2"):
        check_order(first, 1, secret)  # an earlier run's order again
    with pytest.raises(RefusedRun, match="not signed"):
        check_order(first, 0, wire.new_secret())  # another world's key
    # A rank's first order may be a later run (an elastic world's relaunched rank joins
    # the run in progress), still only signed with that run's key.
    third = messages.WarmRun(3, "job-3", b"payload", secret.run_tag("job-3", b"payload"), True)
    check_order(third, 0, secret)
    with pytest.raises(RefusedRun, match="not signed"):
        check_order(third._replace(job_id="job-1"), 0, secret)


def test_a_rank_refuses_a_run_signed_with_an_earlier_runs_key(monkeypatch):
    with HorovodRunner(np=-1, keep_warm=120) as runner:
        first = runner.run(pid)
        dispatch = warm.current().dispatch
        earlier = runner.last_job.job_id
        key = dispatch.secret

        class EarlierKey:  # signs every later run with the first run's key
            def run_tag(self, job_id, blob):
                return key.run_tag(earlier, blob)

        monkeypatch.setattr(dispatch, "secret", EarlierKey())
        with pytest.raises(RankFailedError, match="RefusedRun"):
            runner.run(pid)
        assert _gone([first]) == []


DRIVER = textwrap.dedent(
    """
    import sys, time
    from pyspark.sql import SparkSession
    from sparkdist import HorovodRunner
    from sparkdist.runner.driver import warm

    def pid():
        import os
        return os.getpid()

    spark = SparkSession.builder.master("local-cluster[2,1,1024]").getOrCreate()
    runner = HorovodRunner(np=2, keep_warm=600, start_timeout=120)
    runner.run_all(pid)
    print(" ".join(str(p.pid) for p in runner.last_job.processes), flush=True)
    if sys.argv[1] == "stop":
        spark.stop()
        deadline = time.monotonic() + 30
        while warm.current() is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        print("released" if warm.current() is None else "still kept", flush=True)
    sys.stdin.read()  # until the test kills this driver
    """
)


@pytest.mark.parametrize("end", ["kill", "stop"])
def test_a_killed_driver_or_stopped_session_leaves_no_rank_or_task(tmp_path, end):
    """The driver process killed (a kernel killed), or its SparkSession stopped: within
    30 s no rank, supervisor or Spark process of the warm world is left."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    driver = subprocess.Popen(
        [sys.executable, str(script), end],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    try:
        line = driver.stdout.readline().decode()
        pids = [int(p) for p in line.split()]
        assert pids, "the driver's warm run recorded no process"
        assert [p for p in pids if pid_alive(p)] == pids  # warm: still there after the run
        if end == "stop":  # the driver lives on: its world's processes end
            assert driver.stdout.readline().decode().strip() == "released"
            left = _gone(pids, timeout_s=30.0)
        else:  # its Spark (the JVM, executors, Python workers) and their tasks too
            pids += [p.pid for p in psutil.Process(driver.pid).children(recursive=True)]
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    if end == "kill":
        left = _gone(pids, timeout_s=30.0)
    for pid_ in left:  # ours: started by this test
        os.kill(pid_, signal.SIGKILL)
    assert left == []


def test_torch_distributor_keeps_its_world_until_closed(sc):
    from sparkdist import TorchDistributor

    with TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, keep_warm=120) as dist:
        first = dist.run(pid)
        assert dist.run(pid) == first
    assert _gone([first]) == []


LISTED = "from sparkdist.doctor import check_warm_worlds; print(check_warm_worlds().detail)"


def test_doctor_lists_the_warm_worlds_of_this_machine():
    with HorovodRunner(np=-1, launcher="direct", keep_warm=120) as runner:
        runner.run(pid)
        # Another process of this machine (`sparkdist doctor` in a terminal) sees it.
        seen = subprocess.run([sys.executable, "-c", LISTED], capture_output=True, text=True)
        assert f"driver pid {os.getpid()}: np=-1, direct, keep_warm=120s" in seen.stdout
    seen = subprocess.run([sys.executable, "-c", LISTED], capture_output=True, text=True)
    assert f"driver pid {os.getpid()}" not in seen.stdout  # released: no longer listed


def test_a_warm_runs_payload_crosses_to_each_task_once(sc):
    """Two tasks of two ranks each: each run's payload goes once per task (its relay
    hands it to its second rank), and every rank runs it."""
    options = dict(np=4, ranks_per_task=2, launcher="direct", keep_warm=120, start_timeout=120)
    with HorovodRunner(**options) as runner:
        for x in (1, 2):
            assert [r["x"] for r in runner.run_all(where_am_i, x=x)] == [x] * 4
            job = runner.last_job
            assert job.payload_bytes_sent == 2 * job.payload_bytes


def test_a_run_past_its_time_limit_ends_the_world_with_its_stacks(tmp_path):
    """Only the warm run has the 5 s limit (a run's limit is its own, `warm.PER_RUN`): the
    cold runs before and after it start a world, which takes seconds, more under load."""
    shape = dict(np=-2, launcher="direct", keep_warm=120)
    with HorovodRunner(**shape) as cold, HorovodRunner(**shape, timeout=5) as runner:
        before = cold.run_all(pid)
        with pytest.raises(JobTimeoutError) as timed_out:
            runner.run(stuck, path=str(tmp_path / "ran"))
        ran = [int((tmp_path / f"ran.{rank}").read_text()) for rank in range(2)]
        assert ran == before  # the limited run ran on the warm world the cold run started
        assert "time limit" in str(timed_out.value)
        assert "stuck" in str(timed_out.value)  # where each rank was
        assert runner.last_job.outcome == "failed"
        assert _gone(before) == []
        assert set(cold.run_all(pid)).isdisjoint(before)  # a new world


def test_an_interrupted_warm_run_stops_its_world(tmp_path):
    marker = tmp_path / "ran"
    with HorovodRunner(np=-2, launcher="direct", keep_warm=120) as runner:
        before = runner.run_all(pid)
        watcher = interrupt_once_ranks_ran(marker, 2)
        with pytest.raises(KeyboardInterrupt):
            runner.run(stuck, path=str(marker))
        watcher.join()
        assert runner.last_job.outcome == "interrupted"
        assert _gone(before) == []


def test_each_warm_run_logs_into_the_driver_run_active_then(sc, driver_mlflow):
    from helpers import log_from_every_rank
    from mlflow import MlflowClient

    with HorovodRunner(np=2, launcher="direct", keep_warm=120, start_timeout=120) as runner:
        with driver_mlflow.start_run() as first:
            assert runner.run_all(log_from_every_rank)[0] == first.info.run_id
        with driver_mlflow.start_run() as second:
            assert runner.run_all(log_from_every_rank)[0] == second.info.run_id
    for run in (first, second):
        data = MlflowClient().get_run(run.info.run_id).data
        assert data.metrics.get("from_rank_0") == 1.0 and "from_rank_1" not in data.metrics
        assert data.tags["sparkdist.outcome"] == "succeeded"
    assert MlflowClient().get_run(first.info.run_id).info.status == "FINISHED"
