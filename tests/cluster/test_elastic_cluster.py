"""Elastic jobs (`HorovodRunner(min_np=..., max_np=...)`) on the namespaced standalone
cluster: a world that shrinks when a host is lost and grows back when it returns (with
DDP and driver-path checkpoints, and with FSDP2 and sharded checkpoints resharded to each
new world), and elastic versus fixed-size jobs under Spark's dynamic allocation.

Shares the session's cluster (conftest.py); what a test kills it restores, so later
tests see three live workers and the main driver one executor on each host.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from checks import records, wait_all_gone, wait_no_job_processes
from remote_driver import RemoteDriver

pytestmark = pytest.mark.cluster

RUNNER = {"start_timeout": 120, "timeout": 300}

DYNAMIC_ALLOCATION = {
    "spark.dynamicAllocation.enabled": "true",
    "spark.dynamicAllocation.shuffleTracking.enabled": "true",
    "spark.dynamicAllocation.minExecutors": "0",
    "spark.dynamicAllocation.initialExecutors": "0",
    "spark.dynamicAllocation.maxExecutors": "3",
}


@contextmanager
def submit_conf(conf: dict[str, str]):
    """Extra Spark settings for the remote drivers started inside (remote_driver.py
    passes this process's environment on; spark-submit reads PYSPARK_SUBMIT_ARGS)."""
    before = os.environ.get("PYSPARK_SUBMIT_ARGS")
    args = " ".join(f"--conf {key}={value}" for key, value in conf.items())
    os.environ["PYSPARK_SUBMIT_ARGS"] = f"{args} pyspark-shell"
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYSPARK_SUBMIT_ARGS"]
        else:
            os.environ["PYSPARK_SUBMIT_ARGS"] = before


@pytest.fixture(scope="module")
def dynamic_driver(cluster):
    """An application under dynamic allocation that starts with no executor."""
    with submit_conf(DYNAMIC_ALLOCATION):
        remote = RemoteDriver(cluster, "dynamic", cores=3)
    try:
        yield remote
    finally:
        remote.close()


def wait_executors(remote: RemoteDriver, count: int, timeout_s: float = 90) -> list[str]:
    """Wait until `remote`'s application has `count` executors, each with its Python worker
    running (a small Spark job over all of them): a gang seats the tasks that arrive
    together, so a job whose third task came late to a cold executor started as a world
    of two and grew (seen under load). Returns their hosts."""
    deadline = time.monotonic() + timeout_s
    hosts: list[str] = []
    while time.monotonic() < deadline:
        hosts = remote.call("executor_hosts", timeout=30)
        if len(hosts) >= count and remote.call("warm_up", tasks=count, timeout=60) == count:
            return hosts
        time.sleep(0.5)
    raise TimeoutError(f"driver {remote.name} has {hosts} as executors, not {count}")


def read_steps(progress: Path) -> list[dict]:
    path = progress / "steps.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_step(progress: Path, job, timeout_s: float = 150, **want) -> dict:
    """Wait for a step recorded with the fields of `want` (and step >= want['step']);
    fail at once with the job's result if the job ended first."""
    min_step = want.pop("step", 0)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for row in read_steps(progress):
            if row["step"] >= min_step and all(row[k] == v for k, v in want.items()):
                return row
        if job.done():
            raise AssertionError(f"the job ended before a step with {want}: {job.result()}")
        time.sleep(0.02)
    raise TimeoutError(f"no step with {want} (step >= {min_step}) in {progress}")


def rank_hosts(progress: Path, attempt: int) -> dict[int, str]:
    """rank -> host of the ranks of `attempt` (from their rank-N.json)."""
    found = {}
    for path in progress.glob("rank-*.json"):
        where = json.loads(path.read_text())
        if where["attempt"] == attempt:
            found[where["rank"]] = where["host"]
    return found


def host_index(cluster, address: str) -> int:
    return next(i for i in range(cluster.state.hosts) if cluster.address(i) == address)


def restore_one_executor_per_host(cluster, remote: RemoteDriver) -> list[str]:
    """After a host's loss, the master gave `remote`'s application (no host resource)
    a replacement executor on a survivor. Stop that one (by pid): the master places it
    again on the worker with the most free cores (Spark's default worker selection), the
    returned host once its worker has registered; one placed on a survivor again (the
    worker had not registered yet) is stopped again. Returns the application's executor
    hosts then."""
    app = remote.call("app_id")
    everywhere = [cluster.address(i) for i in range(cluster.state.hosts)]
    deadline = time.monotonic() + 120
    while (hosts := remote.call("executor_hosts")) != everywhere:
        assert time.monotonic() < deadline, f"{remote.name}'s executors stay on {hosts}"
        for i in range(cluster.state.hosts):
            mine = [p for p in cluster.executors(i) if app in " ".join(p.cmdline())]
            for extra in sorted(mine, key=lambda p: p.create_time())[1:]:
                with contextlib.suppress(psutil.NoSuchProcess):  # it ended by itself
                    extra.kill()
                    extra.wait(30)
        time.sleep(0.5)
    return hosts


RELAUNCH = {**RUNNER, "min_np": 2, "max_np": 3, "max_failures": 2}
"""A relaunch-path elastic job that loses a host: `min_np=2` makes the relaunch wait for
both survivors' slots. With 1 it could start a world of one while a survivor's old task
was still ending (seen under load: 3 -> 1 -> 2 -> 3), and then grow."""

ROWS = 240  # 5 steps an epoch with 3 ranks of batch 16: epochs end before and after resizes


def check_each_epoch_read_once(steps: list[dict]) -> None:
    """The ids the world read, step by step across the attempts: each finished epoch has
    every row once (plus the few pads that even out its last step), an unfinished last one
    no row twice. Whether a change falls inside an epoch depends on when it came (one
    at an epoch's end leaves every epoch to one world size); tests/data/test_data_elastic.py
    changes the world inside an epoch on purpose."""
    epochs = sorted({row["epoch"] for row in steps})
    assert epochs == list(range(len(epochs))) and len(epochs) >= 3, epochs
    for epoch in epochs:
        rows = [row for row in steps if row["epoch"] == epoch]
        counts = Counter(i for row in rows for i in row["ids"])
        if epoch == epochs[-1] and len(counts) < ROWS:  # stopped in the middle of it
            assert max(counts.values()) == 1, counts.most_common(3)
            continue
        assert sorted(counts) == list(range(ROWS)), (epoch, sorted(counts))
        assert sum(counts.values()) - ROWS < 3, (epoch, counts.most_common(3))


def test_world_shrinks_on_lost_host_and_grows_back(cluster, driver, host_driver, tmp_path):
    progress = tmp_path / "progress"
    progress.mkdir()
    stop_file = tmp_path / "stop"
    lost = None
    wait_executors(host_driver, 3)
    job = host_driver.submit(
        "run_job",
        main="elastic_main",
        np=3,
        runner=RELAUNCH,
        kwargs={"progress_dir": str(progress), "min_steps": 1, "stop_file": str(stop_file)},
        id_frames={"train": {"rows": ROWS, "path": str(tmp_path / "ids")}},
    )
    try:
        wait_step(progress, job, step=3, world_size=3, attempt=0)
        hosts = rank_hosts(progress, 0)
        assert sorted(hosts.values()) == [cluster.address(i) for i in range(3)]
        lost = host_index(cluster, hosts[2])  # not rank 0's host: its saves are the record
        cluster.stop_worker(lost)
        # Relaunched at once with the two hosts left, from its checkpoint.
        wait_step(progress, job, world_size=2)
        assert sorted(rank_hosts(progress, 1).values()) == sorted(
            cluster.address(i) for i in range(3) if i != lost
        )
        cluster.start_worker(lost)
        # Grows back at a checkpoint once the new host's task stood by.
        wait_step(progress, job, world_size=3, attempt=2)
        stop_file.touch()
        result = job.result(timeout=240)
    finally:
        stop_file.touch()
        if lost is not None and not cluster.alive(f"worker-{lost}"):
            cluster.start_worker(lost)

    assert result["ok"], result.get("error")
    steps = read_steps(progress)
    numbers = [row["step"] for row in steps]
    assert numbers == list(range(1, len(steps) + 1)), numbers  # each step once, in order
    sizes = [row["world_size"] for row in steps]
    changes = [size for i, size in enumerate(sizes) if i == 0 or sizes[i - 1] != size]
    assert changes == [3, 2, 3], sizes
    assert [row["attempt"] for row in steps] == sorted(row["attempt"] for row in steps)
    check_each_epoch_read_once(steps)
    assert result["attempts"] == 3
    assert len(result["failures"]) == 2
    assert cluster.address(lost) in result["failures"][0], result["failures"]
    assert result["failures"][1].startswith("grew:"), result["failures"]
    values = result["values"]
    assert sorted(v["host"] for v in values) == [cluster.address(i) for i in range(3)]
    assert all(v["size"] == 3 and v["attempt"] == 2 and v["step"] == len(steps) for v in values)
    assert values[0]["loss"] < 40.0  # from about 200 at the start
    assert wait_all_gone(records(result), 30) == []
    assert wait_no_job_processes(cluster, 30) == []
    # The cluster is whole again: three workers, the main driver on every host.
    assert cluster.alive_worker_hosts() == [cluster.address(i) for i in range(3)]
    assert restore_one_executor_per_host(cluster, driver) == [cluster.address(i) for i in range(3)]


def test_fsdp_sharded_checkpoints_reshard_as_the_world_shrinks_and_grows(
    cluster, driver, host_driver, tmp_path
):
    """FSDP2 with sharded checkpoints on shared storage: 3 ranks save, a host is lost,
    2 ranks resume the 3-rank checkpoint; the host returns, 3 ranks resume the 2-rank
    one; each time the parameters equal the saved ones."""
    progress = tmp_path / "progress"
    progress.mkdir()
    stop_file = tmp_path / "stop"
    lost = None
    runner = {**RELAUNCH, "checkpoint_dir": str(tmp_path / "checkpoints")}
    wait_executors(host_driver, 3)
    job = host_driver.submit(
        "run_job",
        main="fsdp_elastic_main",
        np=3,
        runner=runner,
        kwargs={"progress_dir": str(progress), "min_steps": 1, "stop_file": str(stop_file)},
    )
    try:
        wait_step(progress, job, step=3, world_size=3, attempt=0)
        lost = host_index(cluster, rank_hosts(progress, 0)[2])
        cluster.stop_worker(lost)
        shrunk = wait_step(progress, job, world_size=2)
        wait_step(progress, job, step=shrunk["step"] + 2, world_size=2)
        cluster.start_worker(lost)
        wait_step(progress, job, world_size=3, attempt=2)
        stop_file.touch()
        result = job.result(timeout=240)
    finally:
        stop_file.touch()
        if lost is not None and not cluster.alive(f"worker-{lost}"):
            cluster.start_worker(lost)

    assert result["ok"], result.get("error")
    sizes = [row["world_size"] for row in read_steps(progress)]
    assert [s for i, s in enumerate(sizes) if i == 0 or sizes[i - 1] != s] == [3, 2, 3], sizes
    resumed = {
        attempt: json.loads((progress / f"resumed-{attempt}.json").read_text())
        for attempt in (1, 2)
    }
    assert (resumed[1]["from_world"], resumed[1]["world"]) == (3, 2), resumed
    assert (resumed[2]["from_world"], resumed[2]["world"]) == (2, 3), resumed
    for row in resumed.values():  # identical parameters; the data position came along
        assert row["same"] and row["data_step"] == row["step"], resumed
    assert result["failures"][1].startswith("grew:"), result["failures"]
    assert wait_all_gone(records(result), 30) == []
    assert wait_no_job_processes(cluster, 30) == []
    assert cluster.alive_worker_hosts() == [cluster.address(i) for i in range(3)]
    assert restore_one_executor_per_host(cluster, driver) == [cluster.address(i) for i in range(3)]


def test_dynamic_allocation_elastic_runs_fixed_size_refused(cluster, dynamic_driver):
    assert dynamic_driver.call("executor_count") == 0
    offset = dynamic_driver.log_path.stat().st_size
    elastic = dynamic_driver.call(
        "run_job", main="network_main", np=3, runner={**RUNNER, "min_np": 1, "max_np": 3}
    )
    assert elastic["ok"], elastic.get("error")
    # Spark asked the master for executors for the job's tasks, and the ranks ran there.
    hosts = dynamic_driver.call("executor_hosts")
    assert 1 <= len(hosts) <= 3
    values = elastic["values"]
    assert {v["host"] for v in values} <= set(hosts)
    assert [v["sum"] for v in values] == [float(sum(range(1, len(values) + 1)))] * len(values)
    # This application takes no decommission notices: the elastic job said so at its start.
    assert "spark.decommission.enabled is not set" in log_since(dynamic_driver, offset)

    fixed = dynamic_driver.call("run_job", main="network_main", np=3, runner=RUNNER)
    assert not fixed["ok"]
    assert fixed["error_type"] == "SparkdistError", fixed["error"]
    assert "dynamic allocation" in fixed["error"] and "min_np" in fixed["error"]
    assert "BarrierJobRunWithDynamicAllocation" not in fixed["error"]
    assert wait_no_job_processes(cluster, 30) == []


# --- in process (issue 40): every rank in `sparkdist.elastic.run`, the direct launcher ----

IN_PROCESS = {**RUNNER, "min_np": 2, "max_np": 3}  # launcher auto: direct for elastic jobs


def read_events(progress: Path) -> dict[int, list[dict]]:
    """launch rank -> its events (`jobs.in_process_elastic_main`), in order."""
    found = {}
    for path in progress.glob("events-*.jsonl"):
        lines = path.read_text().splitlines()
        found[int(path.stem.split("-")[1])] = [json.loads(x) for x in lines if x.strip()]
    return found


def entries(events: list[dict]) -> list[dict]:
    return [e for e in events if e["event"] == "enter"]


def steps_of(events: dict[int, list[dict]], generation: int) -> list[int]:
    """The steps any rank took (logged before their commit) in `generation`."""
    return [
        e["step"]
        for evs in events.values()
        for e in evs
        if e["event"] == "stepped" and e["generation"] == generation
    ]


def test_in_process_survivors_keep_their_processes_as_a_host_is_lost_and_returns(
    cluster, driver, host_driver, tmp_path
):
    """DDP through `elastic.run`, the loader of a DataFrame in the elastic state: a host
    (not world rank 0's) is lost; the two survivors go on in their processes from the
    last commit (at most one step redone), as a world of 2; the host's worker returns and
    a newcomer joins at a commit (no step redone), getting the state by broadcast. After
    each change the parameters are identical on every rank, and every row of an epoch is
    read once across the changes. One attempt throughout, no relaunch."""
    progress = tmp_path / "progress"
    progress.mkdir()
    stop_file = tmp_path / "stop"
    lost = None
    wait_executors(host_driver, 3)
    job = host_driver.submit(
        "run_job",
        main="in_process_elastic_main",
        np=3,
        runner=IN_PROCESS,
        kwargs={"progress_dir": str(progress), "stop_file": str(stop_file), "step_s": 0.3},
        id_frames={"train": {"rows": ROWS, "path": str(tmp_path / "ids")}},
    )
    try:
        wait_step(progress, job, step=3, world_size=3, generation=0)
        first = {launch: entries(evs)[0] for launch, evs in read_events(progress).items()}
        assert sorted(e["host"] for e in first.values()) == [cluster.address(i) for i in range(3)]
        gone = next(launch for launch, e in first.items() if e["rank"] == 2)
        lost = host_index(cluster, first[gone]["host"])
        cluster.stop_worker(lost)
        shrunk = wait_step(progress, job, world_size=2, generation=1)
        wait_step(progress, job, step=shrunk["step"] + 3, world_size=2)
        cluster.start_worker(lost)
        grown = wait_step(progress, job, world_size=3, generation=2)
        wait_step(progress, job, step=grown["step"] + 3, world_size=3)
        stop_file.touch()
        result = job.result(timeout=240)
    finally:
        stop_file.touch()
        if lost is not None and not cluster.alive(f"worker-{lost}"):
            cluster.start_worker(lost)

    assert result["ok"], result.get("error")
    assert (result["attempts"], result["failures"]) == (1, []), result["failures"]
    assert len(result["reformed"]) == 2 and result["reformed"][1].startswith("grew"), result
    events = read_events(progress)
    survivors = sorted(launch for launch in first if launch != gone)
    newcomers = sorted(set(events) - set(first))
    assert len(newcomers) == 1 and newcomers[0] > 2, sorted(events)
    for launch in survivors:  # the same process in every world, in world-rank order
        entered = entries(events[launch])
        assert [e["generation"] for e in entered] == [0, 1, 2], entered
        assert {e["pid"] for e in entered} == {first[launch]["pid"]}
        assert [e["size"] for e in entered] == [3, 2, 3]
        assert [e["rank"] for e in entered[1:]] == [survivors.index(launch)] * 2
    (joined,) = entries(events[newcomers[0]])
    assert (joined["generation"], joined["rank"], joined["size"]) == (2, 2, 3)
    assert joined["host"] == cluster.address(lost) and joined["pid"] != first[gone]["pid"]
    every_entry = [e for evs in events.values() for e in entries(evs)]
    assert all(e["equal"] for e in every_entry), every_entry  # identical after each change
    entry_step = {g: {e["step"] for e in every_entry if e["generation"] == g} for g in (1, 2)}
    assert len(entry_step[1]) == len(entry_step[2]) == 1, entry_step  # one state for all
    assert 0 <= max(steps_of(events, 0)) - entry_step[1].pop() <= 1  # at most one redone
    assert max(steps_of(events, 1)) == entry_step[2].pop()  # a grow, at a commit: none
    # After the loss the survivors held the same commit: no state was sent (no rank loaded
    # a synced one). The newcomer had none: the grow's sync sent it to every rank but 0.
    synced = Counter(
        e["generation"] for evs in events.values() for e in evs if e["event"] == "synced"
    )
    assert (synced[1], synced[2]) == (0, 2), synced

    steps = read_steps(progress)
    assert [row["step"] for row in steps] == list(range(1, len(steps) + 1))  # each kept once
    sizes = [row["world_size"] for row in steps]
    assert [s for i, s in enumerate(sizes) if i == 0 or sizes[i - 1] != s] == [3, 2, 3], sizes
    check_each_epoch_read_once(steps)
    values = [v for v in result["values"] if v is not None]
    assert [v["launch"] for v in values] == [*survivors, *newcomers]
    assert all(v["equal"] and v["size"] == 3 and v["step"] == len(steps) for v in values)
    assert wait_all_gone(records(result), 30) == []
    assert wait_no_job_processes(cluster, 30) == []
    assert cluster.alive_worker_hosts() == [cluster.address(i) for i in range(3)]
    assert restore_one_executor_per_host(cluster, driver) == [cluster.address(i) for i in range(3)]


def test_in_process_ranks_hung_on_a_cut_host_are_unblocked_within_the_timeout(
    cluster, driver, host_driver, tmp_path
):
    """A host's network is cut: no RST reaches anyone, and the survivors hang in their
    next collective with its rank until the elastic timeout (SPARKDIST_ELASTIC_TIMEOUT_S)
    fails it, not longer. Then they restore the last commit and, once the driver has lost
    contact with the host too, go on as a world of 2 in their processes."""
    timeout_s, step_s = 8.0, 0.3  # sparkdist's dead-peer detection takes 15 s: gloo is first
    progress = tmp_path / "progress"
    progress.mkdir()
    stop_file = tmp_path / "stop"
    wait_executors(host_driver, 3)
    job = host_driver.submit(
        "run_job",
        main="in_process_elastic_main",
        np=3,
        runner=IN_PROCESS,
        kwargs={
            "progress_dir": str(progress),
            "stop_file": str(stop_file),
            "step_s": step_s,
            "elastic_timeout_s": timeout_s,
        },
    )
    cut = None
    try:
        wait_step(progress, job, step=3, world_size=3, generation=0)
        first = {launch: entries(evs)[0] for launch, evs in read_events(progress).items()}
        gone = next(launch for launch, e in first.items() if e["rank"] == 2)
        cut = host_index(cluster, first[gone]["host"])
        cluster.set_link(cut, up=False)
        cut_at = time.time()
        shrunk = wait_step(progress, job, world_size=2, generation=1)
        wait_step(progress, job, step=shrunk["step"] + 3, world_size=2)
    finally:
        stop_file.touch()
        if cut is not None:
            cluster.set_link(cut, up=True)
    result = job.result(timeout=240)

    assert result["ok"], result.get("error")
    assert result["attempts"] == 1 and result["reformed"], result
    events = read_events(progress)
    survivors = sorted(launch for launch in first if launch != gone)
    for launch in survivors:
        restored = [e for e in events[launch] if e["event"] == "restored" and e["at"] > cut_at]
        assert restored, f"launch rank {launch} never went back to its commit"
        took = restored[0]["at"] - cut_at
        # Hung from its next collective (at most a step's pause after the cut) until the
        # timeout: not before it, not much after.
        assert timeout_s * 0.9 <= took <= timeout_s + step_s + 3.0, took
        again = entries(events[launch])[1]
        assert (again["generation"], again["size"], again["pid"]) == (1, 2, first[launch]["pid"])
        assert again["equal"]
    print(
        f"in process, network cut: survivors unblocked {took:.1f} s after the cut "
        f"(timeout {timeout_s:.0f} s), world of 2 stepping "
        f"{shrunk['at'] - cut_at:.1f} s after it"
    )
    assert wait_all_gone(records(result), 60) == []
    assert wait_no_job_processes(cluster, 60) == []
    wait_executors(host_driver, 3)
    assert restore_one_executor_per_host(cluster, driver) == [cluster.address(i) for i in range(3)]


def test_in_process_world_cut_off_for_less_than_dead_peer_detection_re_forms_whole(
    cluster, driver, host_driver, tmp_path
):
    """A host is cut off for longer than the elastic timeout but less than the driver's
    dead-peer detection (issue 64, the soak's second finding): every rank's collective
    times out, nobody is lost, and each says its world broke as it waits for the next;
    once the cut one reaches the driver again, the driver forms generation 1 of all three,
    in their processes. Before, no world formed and the job stalled until it failed."""
    timeout_s, cut_s = 4.0, 9.0  # cut_s < wire.DEAD_PEER_S (15 s), TCP's retries included
    progress = tmp_path / "progress"
    progress.mkdir()
    stop_file = tmp_path / "stop"
    wait_executors(host_driver, 3)
    job = host_driver.submit(
        "run_job",
        main="in_process_elastic_main",
        np=3,
        runner=IN_PROCESS,
        kwargs={
            "progress_dir": str(progress),
            "stop_file": str(stop_file),
            "step_s": 0.3,
            "elastic_timeout_s": timeout_s,
        },
    )
    try:
        wait_step(progress, job, step=3, world_size=3, generation=0)
        first = {launch: entries(evs)[0] for launch, evs in read_events(progress).items()}
        cut = host_index(cluster, next(e["host"] for e in first.values() if e["rank"] == 2))
        cluster.set_link(cut, up=False)
        cut_at = time.time()
        time.sleep(cut_s)  # the cut's length is what the test is about
        cluster.set_link(cut, up=True)
        whole = wait_step(progress, job, world_size=3, generation=1)
        wait_step(progress, job, step=whole["step"] + 3, world_size=3)
    finally:
        stop_file.touch()
    result = job.result(timeout=240)

    assert result["ok"], result.get("error")
    assert (result["attempts"], result["failures"], result["reformed"]) == (1, [], []), result
    events = read_events(progress)
    assert sorted(events) == sorted(first), sorted(events)  # nobody new, nobody left
    for launch, entered in first.items():
        again = entries(events[launch])[1]
        assert (again["generation"], again["size"], again["pid"]) == (1, 3, entered["pid"])
        assert again["rank"] == entered["rank"] and again["equal"]
        assert [e for e in events[launch] if e["event"] == "restored" and e["at"] > cut_at]
    print(
        f"in process, a {cut_s:.0f} s cut (timeout {timeout_s:.0f} s): the world of 3 "
        f"stepped again {whole['at'] - cut_at:.1f} s after the cut"
    )
    assert wait_all_gone(records(result), 60) == []
    assert wait_no_job_processes(cluster, 60) == []


# --- decommission notices (issue 41): a host is given Spark's decommission signal, and
# --- killed NOTICE_S later, as a cloud takes back a spot instance ----------------------

NOTICE_S = 15.0


def log_since(remote: RemoteDriver, offset: int) -> str:
    """What the remote driver logged after `offset` (its log file's size before)."""
    with open(remote.log_path, "rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")


def notice_then_kill(
    cluster, remote: RemoteDriver, host: int, before_kill, lead_s: float = NOTICE_S
) -> tuple[float, float]:
    """SIGPWR host `host`'s worker, call `before_kill()` (it waits, NOTICE_S after the
    notice at most, for what the job must do first), then SIGKILL the host `lead_s` after
    the notice (at once if that has passed). Returns (notice, kill)."""
    notice = cluster.decommission_worker(host)
    before_kill(notice + NOTICE_S)
    time.sleep(max(0.0, notice + lead_s - time.time()))
    killed = time.time()
    cluster.stop_worker(host)
    return notice, killed


def restore_host(cluster, driver, host: int | None) -> None:
    if host is not None and not cluster.alive(f"worker-{host}"):
        cluster.start_worker(host)


def test_notice_relaunch_path_leaves_the_host_with_nothing_redone(
    cluster, driver, host_driver, tmp_path
):
    """A DDP job that saves every 10 steps (`save(..., every=10)`): at the notice rank 0
    saves the step it is at, the world is relaunched at once without the leaving host, and
    is at 2 ranks before the host is killed. No step is redone, each loader row is read
    once an epoch, and the notice counts against no max_failures (0 here)."""
    progress = tmp_path / "progress"
    progress.mkdir()
    stop_file = tmp_path / "stop"
    lost = None
    offset = host_driver.log_path.stat().st_size
    wait_executors(host_driver, 3)
    job = host_driver.submit(
        "run_job",
        main="elastic_main",
        np=3,
        runner={**RUNNER, "min_np": 2, "max_np": 3, "max_failures": 0},
        kwargs={
            "progress_dir": str(progress),
            "min_steps": 1,
            "stop_file": str(stop_file),
            "save_every": 10,
        },
        id_frames={"train": {"rows": ROWS, "path": str(tmp_path / "ids")}},
    )
    try:
        wait_step(progress, job, step=3, world_size=3, attempt=0)
        hosts = rank_hosts(progress, 0)
        lost = host_index(cluster, hosts[2])
        smaller: dict = {}

        def world_of_two(deadline: float) -> None:
            smaller.update(wait_step(progress, job, world_size=2, timeout_s=deadline - time.time()))

        notice, killed = notice_then_kill(cluster, host_driver, lost, world_of_two)
        # Three epochs at least (5 steps each at 3 ranks, 7.5 at 2), one across the change.
        wait_step(progress, job, step=max(smaller["step"] + 3, 22), world_size=2)
        stop_file.touch()
        result = job.result(timeout=240)
    finally:
        stop_file.touch()
        restore_host(cluster, driver, lost)

    assert result["ok"], result.get("error")
    steps = read_steps(progress)
    numbers = [row["step"] for row in steps]
    assert numbers == list(range(1, len(steps) + 1)), numbers  # nothing redone
    left = [row for row in steps if row["attempt"] == 0][-1]
    assert left["saved"] and left["at"] > notice, left  # saved at the notice
    assert smaller["at"] < killed, (smaller["at"] - notice, killed - notice)
    check_each_epoch_read_once(steps)
    assert result["attempts"] == 2, result["failures"]
    (why,) = result["failures"]
    address = cluster.address(lost)
    assert why.startswith("left: executor ") and address in why, why
    assert why.endswith(f"resuming from step {left['step']}"), why
    lines = [
        line
        for line in log_since(host_driver, offset).splitlines()
        if address in line and "being decommissioned" in line and "world 3 -> 2 ranks" in line
    ]
    assert len(lines) == 1 and f"step {left['step']}" in lines[0], lines
    print(
        f"relaunch path, notice: world of 2 stepping {smaller['at'] - notice:.1f} s after "
        f"the notice, {killed - smaller['at']:.1f} s before the kill; 0 steps redone"
    )
    assert wait_all_gone(records(result), 30) == []
    assert wait_no_job_processes(cluster, 30) == []
    wait_executors(host_driver, 3)
    assert restore_one_executor_per_host(cluster, driver) == [cluster.address(i) for i in range(3)]


def test_notice_for_a_fixed_size_job_is_logged_then_the_loss_as_ever(
    cluster, driver, host_driver, tmp_path
):
    """A fixed-size job cannot leave a host: the driver logs at the notice that the job
    will fail there, why, and what would not (min_np/max_np); the host's loss then
    relaunches it from its checkpoint as it always did."""
    progress = tmp_path / "progress"
    progress.mkdir()
    stop_file = tmp_path / "stop"
    lost = None
    offset = host_driver.log_path.stat().st_size
    wait_executors(host_driver, 3)
    job = host_driver.submit(
        "run_job",
        main="elastic_main",
        np=2,
        runner={**RUNNER, "max_failures": 1},
        kwargs={"progress_dir": str(progress), "min_steps": 1, "stop_file": str(stop_file)},
    )
    try:
        wait_step(progress, job, step=3, world_size=2, attempt=0)
        lost = host_index(cluster, rank_hosts(progress, 0)[1])
        address = cluster.address(lost)

        def logged(deadline: float) -> None:
            while address not in log_since(host_driver, offset):
                assert time.time() < deadline, "no notice line before the kill"
                time.sleep(0.2)

        # Nothing leaves at the notice: the loss can come once it is logged.
        notice, killed = notice_then_kill(cluster, host_driver, lost, logged, lead_s=0.0)
        wait_step(progress, job, world_size=2, attempt=1)
        stop_file.touch()
        result = job.result(timeout=240)
    finally:
        stop_file.touch()
        restore_host(cluster, driver, lost)

    assert result["ok"], result.get("error")
    assert result["attempts"] == 2 and address in result["failures"][0], result["failures"]
    log = log_since(host_driver, offset)
    (line,) = [x for x in log.splitlines() if "being decommissioned" in x]
    assert address in line and "fixed-size job (np=2) fails" in line and "min_np" in line, line
    assert log.index(line) < log.index("relaunching it"), log[-2000:]
    print(f"fixed-size job, notice: logged, and the host killed {killed - notice:.1f} s after")
    assert wait_all_gone(records(result), 30) == []
    assert wait_no_job_processes(cluster, 30) == []
    wait_executors(host_driver, 3)
    assert restore_one_executor_per_host(cluster, driver) == [cluster.address(i) for i in range(3)]


def test_notice_in_process_the_leaving_rank_goes_at_its_next_commit(
    cluster, driver, host_driver, tmp_path
):
    """DDP through `elastic.run`: at the notice the driver forms a world without the
    leaving rank; every rank stops at its next commit (nothing rolled back), the survivors
    go on in their processes as a world of 2 before the host is killed, the leaving rank
    returns None, and the job never fails, relaunches or counts the notice."""
    progress = tmp_path / "progress"
    progress.mkdir()
    stop_file = tmp_path / "stop"
    lost = None
    offset = host_driver.log_path.stat().st_size
    wait_executors(host_driver, 3)
    job = host_driver.submit(
        "run_job",
        main="in_process_elastic_main",
        np=3,
        runner={**IN_PROCESS, "max_failures": 0},
        kwargs={"progress_dir": str(progress), "stop_file": str(stop_file), "step_s": 0.3},
        id_frames={"train": {"rows": ROWS, "path": str(tmp_path / "ids")}},
    )
    try:
        wait_step(progress, job, step=3, world_size=3, generation=0)
        first = {launch: entries(evs)[0] for launch, evs in read_events(progress).items()}
        gone = next(launch for launch, e in first.items() if e["rank"] == 2)
        lost = host_index(cluster, first[gone]["host"])
        smaller: dict = {}

        def world_of_two(deadline: float) -> None:
            smaller.update(
                wait_step(
                    progress, job, world_size=2, generation=1, timeout_s=deadline - time.time()
                )
            )

        notice, killed = notice_then_kill(cluster, host_driver, lost, world_of_two)
        # Three epochs at least (5 steps each at 3 ranks, 7.5 at 2), one across the change.
        wait_step(progress, job, step=max(smaller["step"] + 3, 22), world_size=2)
        stop_file.touch()
        result = job.result(timeout=240)
    finally:
        stop_file.touch()
        restore_host(cluster, driver, lost)

    assert result["ok"], result.get("error")
    assert (result["attempts"], result["failures"]) == (1, []), result["failures"]
    (left,) = result["reformed"]
    address = cluster.address(lost)
    assert left.startswith("left: executor ") and address in left, left
    assert smaller["at"] < killed, (smaller["at"] - notice, killed - notice)
    events = read_events(progress)
    survivors = sorted(launch for launch in first if launch != gone)
    for launch in survivors:  # the same process, no rollback: on from the step it left
        entered = entries(events[launch])
        assert [(e["generation"], e["size"], e["pid"]) for e in entered] == [
            (0, 3, first[launch]["pid"]),
            (1, 2, first[launch]["pid"]),
        ]
        assert not [e for e in events[launch] if e["event"] == "restored"]
    assert {e["step"] for s in survivors for e in entries(events[s])[1:]} == {
        max(steps_of(events, 0))
    }
    steps = read_steps(progress)
    assert [row["step"] for row in steps] == list(range(1, len(steps) + 1))  # none redone
    check_each_epoch_read_once(steps)
    assert [v["launch"] for v in result["values"]] == survivors  # the leaving one: None
    lines = [
        line
        for line in log_since(host_driver, offset).splitlines()
        if "being decommissioned" in line and "world 3 -> 2 ranks" in line
    ]
    assert len(lines) == 1 and address in lines[0], lines
    # The trace (issue 63): the notice on the driver and on the leaving rank's track.
    notices = [i for i in result["trace_instants"] if i["name"] == "notice"]
    assert {i["pid"] for i in notices} == {0, gone + 1}, notices
    assert all(address in i["args"]["why"] for i in notices), notices
    print(
        f"in process, notice: world of 2 stepping {smaller['at'] - notice:.1f} s after the "
        f"notice, {killed - smaller['at']:.1f} s before the kill; 0 steps redone"
    )
    assert wait_all_gone(records(result), 30) == []
    assert wait_no_job_processes(cluster, 30) == []
    wait_executors(host_driver, 3)
    assert restore_one_executor_per_host(cluster, driver) == [cluster.address(i) for i in range(3)]
