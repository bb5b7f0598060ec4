"""The rank side of in-process elastic training (`sparkdist.elastic`), with real processes,
real gloo groups formed by the package's own group code, and the driver's real service.

* One process: what `commit()` keeps and `restore()` brings back (no alias of the commit),
  and the hook a value that follows the world gets.
* Three spawned rank processes against a real `DriverService`: `elastic.run` forms the
  group (the store's address exchanged through the driver's KV), syncs world rank 0's
  state (parameters, optimizer, plain values) and trains DDP; a peer killed or hung in a
  collective unblocks the survivors (at once, or within the stated timeout).
* Two spawned ranks end world after world as `elastic.run` does while gloo's worker still
  holds a collective: no rank waits forever for the GIL, and every old group is freed.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import threading
import time
from collections import Counter

import pytest
import torch

from sparkdist import elastic, job_environment
from sparkdist.elastic import torch_group
from sparkdist.elastic.generations import Generation
from sparkdist.protocol import driver_channel, messages, wire
from sparkdist.protocol.job_secret import JobSecret
from sparkdist.runner.driver.job_state import JobState
from sparkdist.runner.driver.records import JobSpec
from sparkdist.runner.driver.service import DriverService

TIMEOUT_S = 3.0
"""The elastic timeout the ranks of these tests run with."""
COLLECTIVE_FAILED = 3
START_S = 120


def _model(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def _step(model, optimizer, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    loss = model(torch.randn(16, 4, generator=generator)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def _flat(state) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in state.model.parameters()])


class _Follower:
    """A value that follows the world, as sparkdist's data loader does."""

    def __init__(self):
        self.position, self.places = 0, []

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]

    def on_world_change(self, rank, world_size):
        self.places.append((rank, world_size))


def test_commit_and_restore_keep_and_bring_back_the_state():
    model, optimizer = _model(0)
    follower = _Follower()
    state = elastic.TorchState(model=model, optimizer=optimizer, step=0, history=[1], data=follower)
    _step(model, optimizer, 1)
    state.step, follower.position = 1, 16
    state.history.append(2)
    state.commit()  # outside elastic.run: a local commit, no world to check
    committed = _flat(state).clone()
    moments = optimizer.state_dict()["state"][0]["exp_avg"].clone()
    for attempt in range(2):  # a restored state trained on must not change the commit
        _step(model, optimizer, 2 + attempt)
        state.step, follower.position = 5, 99
        state.history.append(3)
        assert not torch.equal(_flat(state), committed)
        state.restore()
        assert torch.equal(_flat(state), committed)
        assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], moments)
        assert (state.step, state.history, follower.position) == (1, [1, 2], 16)
    assert state.data is follower  # a stateful value is loaded in place, not replaced
    state.announce_world()
    assert follower.places == [(0, 1)]
    assert isinstance(elastic.ObjectState(a=1), elastic.State)


def test_a_commit_overwrites_the_last_commits_tensors_instead_of_allocating():
    model, optimizer = _model(0)
    state = elastic.TorchState(model=model, optimizer=optimizer, step=0)
    _step(model, optimizer, 1)
    state.commit()  # the first commit with optimizer moments: new tensors
    weight = state._saved["model"]["0.weight"]
    moments = state._saved["optimizer"]["state"][0]["exp_avg"]
    buffers = weight.untyped_storage().data_ptr(), moments.untyped_storage().data_ptr()
    _step(model, optimizer, 2)
    state.step = 2
    state.commit()
    again = state._saved["model"]["0.weight"], state._saved["optimizer"]["state"][0]["exp_avg"]
    assert tuple(t.untyped_storage().data_ptr() for t in again) == buffers
    committed = _flat(state).clone()
    _step(model, optimizer, 3)
    state.restore()  # the overwritten commit is the newest one, and a restore keeps it
    assert torch.equal(_flat(state), committed) and state.step == 2
    assert not any(t.data_ptr() == p.data_ptr() for t in again for p in model.parameters())


def test_run_outside_a_rank_and_bad_settings_say_so(monkeypatch):
    with pytest.raises(TypeError, match="elastic State"):
        elastic.run(lambda state: None)({"step": 0})
    with pytest.raises(RuntimeError, match="sparkdist rank"):
        elastic.run(lambda state: None)(elastic.ObjectState(step=0))
    monkeypatch.setenv(job_environment.ELASTIC_TIMEOUT_S, "soon")
    with pytest.raises(ValueError, match="positive number of seconds"):
        torch_group.timeout_s()
    assert torch_group.backend_for_rank({}) == "gloo"  # no GPU here
    assert torch_group.backend_for_rank({job_environment.ELASTIC_BACKEND: "nccl"}) == "nccl"
    with pytest.raises(ValueError, match='"nccl" or "gloo"'):
        torch_group.backend_for_rank({job_environment.ELASTIC_BACKEND: "mpi"})


# --- rank processes against a real driver service ------------------------------------


def _connect(rank: int, world_size: int, address: str, secret_text: str) -> None:
    """What `rank/main.py` does before the user's function, for a spawned test rank."""
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            job_environment.TASK_HOST: "127.0.0.1",
            job_environment.ELASTIC_TIMEOUT_S: str(TIMEOUT_S),
        }
    )
    client = driver_channel.connect(address, JobSecret.from_text(secret_text))
    client.request(messages.RankHello(rank, "127.0.0.1", os.getpid()))


def _train_rank(rank, world_size, address, secret_text, results) -> None:
    import torch.distributed as dist

    _connect(rank, world_size, address, secret_text)
    model, optimizer = _model(seed=rank)  # each rank starts different: sync makes them one
    follower = _Follower()
    state = elastic.TorchState(model, optimizer, step=0, owner=f"rank {rank}", data=follower)

    @elastic.run
    def train(state):
        entered = _flat(state)
        ddp = torch.nn.parallel.DistributedDataParallel(state.model)
        while state.step < 3:
            _step(ddp, state.optimizer, seed=100 * state.step + state.rank)
            state.step += 1
            follower.position += 16
            state.commit()
        committed = _flat(state)
        _step(state.model, state.optimizer, seed=7)  # a step past the commit, rolled back
        state.restore()
        state.sync()
        gathered = [torch.zeros_like(committed) for _ in range(state.world_size)]
        dist.all_gather(gathered, committed)
        same = [torch.equal(g, gathered[0]) for g in gathered]
        return (
            entered.tolist(),
            torch.equal(_flat(state), committed),
            same,
            state.owner,
            state.step,
            follower.places,
            state.rank,
            state.world_size,
        )

    results.put((rank, train(state)))


def _hang_rank(rank, world_size, address, secret_text, in_collective) -> None:
    """Ranks 0 and 1 enter an all_reduce that rank 2 never joins; exit code 3 if it raised
    the error of a broken group."""
    import torch.distributed as dist

    _connect(rank, world_size, address, secret_text)
    client = driver_channel.driver_client()
    torch_group.form(Generation(0, tuple(range(world_size))), rank, client, TIMEOUT_S)
    dist.all_reduce(torch.ones(4))  # the group works
    in_collective[rank].set()
    if rank == world_size - 1:
        time.sleep(3600)  # the test kills or stops this one
    try:
        dist.all_reduce(torch.ones(4))
    except Exception as exc:  # noqa: BLE001 - the test checks which
        os._exit(COLLECTIVE_FAILED if torch_group.is_collective_failure(exc) else 4)
    os._exit(5)


WORLDS = 5
"""How many worlds `_end_worlds_rank` forms and ends."""


def _gloo_workers() -> int:
    """The gloo worker threads alive in this process (each group has its own)."""
    tasks = os.listdir("/proc/self/task")
    return sum(open(f"/proc/self/task/{t}/comm").read().strip() == "pt_gloo_runloop" for t in tasks)


def _end_worlds_rank(rank, world_size, address, secret_text, results) -> None:
    """Form a world, train a DDP step in it, end it as `elastic.run` ends one (destroy the
    group, free the world's DDP, then `free_old_groups`); `WORLDS` times. Before each end a
    collective is started and not waited for, with a Python object in the thread's state
    (DDP's collectives in backward carry one: torch's copy of the contextvars): gloo's
    worker holds it, and must take the GIL to let it go, while the group is freed. Freed
    by the DDP's reducer with the GIL held, that waited forever at the first world."""
    import torch.distributed as dist

    _connect(rank, world_size, address, secret_text)
    client = driver_channel.driver_client()
    for number in range(WORLDS):
        members = tuple(range(world_size))
        group = torch_group.form(Generation(number, members), rank, client, TIMEOUT_S)
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
        ddp(torch.randn(2, 4)).sum().backward()
        torch._C._stash_obj_in_tls("test", object())
        dist.all_reduce(torch.ones(4), async_op=True)
        torch._C._remove_obj_from_tls("test")
        group.destroy()
        del ddp
        gc.collect()
        torch_group.free_old_groups()
    results.put((rank, _gloo_workers()))


class _Ranks:
    """A real `DriverService` and `world_size` spawned rank processes connected to it."""

    def __init__(self, world_size: int, target, extra):
        self.state = JobState(JobSpec("job", world_size, b"payload", False, "all"))
        self.secret = wire.new_secret()
        self.service = DriverService(self.state, self.secret, "127.0.0.1", "127.0.0.1")
        address = self.service.address
        address = address if isinstance(address, str) else "{}:{}".format(*address)
        context = multiprocessing.get_context("spawn")
        self.procs = [
            context.Process(
                target=target, args=(r, world_size, address, self.secret.to_text(), extra)
            )
            for r in range(world_size)
        ]
        for proc in self.procs:
            proc.start()

    def close(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
            proc.join()
        self.service.close()


def test_run_forms_a_gloo_group_syncs_from_rank_zero_and_trains():
    results = multiprocessing.get_context("spawn").Queue()
    ranks = _Ranks(3, _train_rank, results)
    try:
        got = dict(results.get(timeout=START_S) for _ in range(3))
        for proc in ranks.procs:
            proc.join(START_S)
            assert proc.exitcode == 0
    finally:
        ranks.close()
    initial_zero = _flat(elastic.TorchState(_model(seed=0)[0])).tolist()
    for rank, (entered, restored, same, owner, step, places, world_rank, size) in got.items():
        assert entered == pytest.approx(initial_zero)  # every rank starts from rank 0's model
        assert restored and all(same)  # back to the commit; parameters equal on every rank
        assert (owner, step, world_rank, size) == ("rank 0", 3, rank, 3)
        assert places == [(rank, 3)]  # the loader-like value heard where it is


def test_ending_worlds_frees_their_groups_without_waiting_for_the_gil():
    results = multiprocessing.get_context("spawn").Queue()
    ranks = _Ranks(2, _end_worlds_rank, results)
    try:
        got = dict(results.get(timeout=START_S) for _ in range(2))
        for proc in ranks.procs:
            proc.join(START_S)
            assert proc.exitcode == 0
    finally:
        ranks.close()
    assert got == {0: 0, 1: 0}  # every world's group freed: its threads ended, sockets closed


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_collective_is_unblocked_when_a_peer_dies_or_hangs(how):
    """A peer killed in a collective fails it at once (its sockets close); a peer that
    hangs fails it after the elastic timeout. Either way the survivors raise a broken
    group's error, which `elastic.run` recovers from."""
    context = multiprocessing.get_context("spawn")
    in_collective = [context.Event() for _ in range(3)]
    ranks = _Ranks(3, _hang_rank, in_collective)
    try:
        for event in in_collective:
            assert event.wait(START_S)
        began = time.monotonic()
        os.kill(ranks.procs[2].pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        limit = 2.0 if how == "killed" else TIMEOUT_S + 5.0
        for survivor in ranks.procs[:2]:
            survivor.join(max(0.0, began + limit - time.monotonic()))
            assert survivor.exitcode == COLLECTIVE_FAILED, f"{how}: survivor still waiting"
        took = time.monotonic() - began
        if how == "stopped":
            assert took >= TIMEOUT_S * 0.9  # gloo waited its timeout, no less
    finally:
        ranks.close()


# --- end to end: a real elastic job on Spark (local-cluster), DDP through elastic.run -----


LOADER = {"batch_size": 10, "num_epochs": 1, "shuffle": True, "seed": 3, "pad_column": "is_pad"}
LR = 0.01


def ddp_main(out: str, data) -> dict:
    """DDP through `elastic.run` over one epoch of `data` (a converter), its loader in the
    state: world 0 steps slowly, until the test changes the world. Each rank logs its
    entries into `train` and, at each step, the rows it read."""
    import json
    import time
    from pathlib import Path

    import torch
    import torch.distributed as dist

    from sparkdist import elastic

    launch, pid = int(os.environ["RANK"]), os.getpid()
    log = Path(out, f"log-{launch}.jsonl")
    model, optimizer = _model(seed=launch)
    with data.make_torch_dataloader(**LOADER) as loader:
        state = elastic.TorchState(model=model, optimizer=optimizer, step=0, loader=loader)

        def write(**event) -> None:
            with log.open("a") as file:
                event.update(generation=state.generation, pid=pid, time=time.time())
                file.write(json.dumps(event) + "\n")

        def rescale() -> None:  # after a change, before the sync
            for group in state.optimizer.param_groups:
                group["lr"] = LR * state.world_size

        state.register_reset_callbacks([rescale])

        @elastic.run
        def train(state):
            write(event="enter", step=state.step, rank=state.rank, size=state.world_size)
            ddp = torch.nn.parallel.DistributedDataParallel(state.model)
            for batch in state.loader:
                x = batch["x"].float().reshape(-1, 1).repeat(1, 4) / 1000
                state.optimizer.zero_grad()
                ddp(x).pow(2).mean().backward()
                state.optimizer.step()
                state.step += 1
                ids, pads = batch["id"].tolist(), batch["is_pad"].tolist()
                rows = [i for i, pad in zip(ids, pads, strict=True) if not pad]
                write(event="stepped", step=state.step, rows=rows)
                state.commit()  # world 0's last step: raises WorldChanged (grow) or fails (loss)
                if state.generation == 0:
                    time.sleep(0.05)  # until the test changes the world
            mine = _flat(state)
            gathered = [torch.zeros_like(mine) for _ in range(state.world_size)]
            dist.all_gather(gathered, mine)
            equal = all(torch.equal(g, mine) for g in gathered)
            return {
                "launch": launch,
                "pid": pid,
                "generation": state.generation,
                "lr": state.optimizer.param_groups[0]["lr"],
                "equal": equal,
            }

        return train(state)


def _events(out, launch: int) -> list[dict]:
    import json

    path = out / f"log-{launch}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _assert_grew_from_two_to_four(entries: dict[int, list[dict]], last_before: int) -> None:
    """Launch ranks 0 and 1 went on in their processes as ranks 0 and 1 of 4, and 2 and 3
    joined generation 1 as ranks 2 and 3, all from the step world 0 last took."""
    for launch in (0, 1):
        first, again = entries[launch]
        assert (first["generation"], again["generation"]) == (0, 1)
        assert again["pid"] == first["pid"] and (again["rank"], again["size"]) == (launch, 4)
    for launch in (2, 3):
        (joined,) = entries[launch]
        assert (joined["generation"], joined["rank"], joined["size"]) == (1, launch, 4)
    assert {e["step"] for r in range(4) for e in entries[r][-1:]} == {last_before}  # none redone


def _world_change(out, launches) -> tuple[dict[int, list[dict]], int]:
    """Each rank's entries into `train`, and the last step world 0 took (on any rank)."""
    events = {launch: _events(out, launch) for launch in launches}
    entries = {
        launch: [e for e in found if e["event"] == "enter"] for launch, found in events.items()
    }
    steps = [
        e["step"]
        for found in events.values()
        for e in found
        if e["event"] == "stepped" and e["generation"] == 0
    ]
    return entries, max(steps)


def _rows_read_once(out, launches, rows: int, restored: int) -> None:
    """Every row of the epoch was read once in the steps that count: world 0's up to the
    commit world 1 restored, and world 1's."""
    kept = Counter()
    for launch in launches:
        for event in _events(out, launch):
            if event["event"] == "stepped" and (
                event["generation"] > 0 or event["step"] <= restored
            ):
                kept.update(event["rows"])
    assert sorted(kept) == list(range(rows)) and set(kept.values()) == {1}


def _ddp_job(spark, out, rows: int, beside, **options):
    """`ddp_main` over a DataFrame of `rows` rows, as an elastic job (2 ranks per task,
    direct) while `beside()` runs in a thread: the runner and the job's result."""
    from sparkdist import HorovodRunner

    df = spark.range(rows).selectExpr("id", "cast(id as double) as x").repartition(4)
    thread = threading.Thread(target=beside, daemon=True)
    thread.start()
    runner = HorovodRunner(ranks_per_task=2, launcher="direct", **options)
    result = runner.run(ddp_main, out=str(out), data=df)
    thread.join(timeout=5)
    return runner, result


def test_ddp_survivors_keep_their_processes_when_a_rank_is_killed(spark, tmp_path):
    """4 ranks (2 per task on the two executors), min_np=2: launch rank 0 (world rank 0,
    whose state everyone synced from) is killed mid-epoch; ranks 1-3 go on in their
    processes as world 0-2, from launch rank 1's last commit, at most one step redone,
    with equal parameters, each row of the epoch read once, and the job's result is
    launch rank 1's."""
    from test_elastic import still_alive, wait_for

    def commits(launch: int) -> list[int]:
        return [e["step"] for e in _events(tmp_path, launch) if e["event"] == "stepped"]

    def kill_rank_0() -> None:
        wait_for(lambda: all(len(commits(r)) >= 3 for r in range(4)), "3 steps on every rank")
        os.kill(next(e["pid"] for e in _events(tmp_path, 0)), signal.SIGKILL)
        killed_at.append(time.time())

    killed_at: list[float] = []
    runner, result = _ddp_job(spark, tmp_path, 2000, kill_rank_0, np=4, min_np=2, max_np=4)

    entries, last_before = _world_change(tmp_path, launches=range(4))
    assert [e["generation"] for e in entries[0]] == [0]
    for launch in (1, 2, 3):
        first, again = entries[launch]
        assert (first["generation"], again["generation"]) == (0, 1)
        assert again["pid"] == first["pid"]  # the same process
        assert (again["rank"], again["size"]) == (launch - 1, 3)
        assert last_before - again["step"] <= 1  # at most one step redone
    assert result["launch"] == 1 and result["generation"] == 1 and result["equal"]
    assert result["lr"] == LR * 3  # the reset callback ran, in the world of 3
    _rows_read_once(tmp_path, range(4), rows=2000, restored=entries[1][1]["step"])
    job = runner.last_job
    assert job.attempts == 1 and job.failures == [] and len(job.reformed) == 1
    assert still_alive(runner) == []
    resumed = min(
        e["time"] for e in _events(tmp_path, 1) if e["generation"] == 1 and e["event"] == "stepped"
    )
    recovery = resumed - killed_at[0]
    print(f"in process: {recovery:.2f} s from the kill to world 1's first step")
    assert recovery < 15.0  # no rank waited out a collective's timeout (30 s)


def test_ddp_world_grows_at_a_commit_and_newcomers_get_the_state_by_broadcast(spark, tmp_path):
    """2 ranks on one task while another Spark job holds the second slot; once it frees
    the slot, the driver seats 2 more ranks and forms world 1 with them. The running ranks
    see it at a commit (`WorldChanged`: no step redone), keep their processes, and the
    newcomers start from their state (synced by broadcast, not from storage), their loaders
    too: each row of the epoch is read once."""
    from test_elastic import SlotHolder, still_alive, wait_for

    out = tmp_path / "ranks"
    out.mkdir()
    holder = SlotHolder(spark.sparkContext, tmp_path, slots=1)

    def free_the_slot() -> None:
        wait_for(lambda: all(len(_events(out, r)) >= 4 for r in range(2)), "3 steps")
        holder.release()

    runner, result = _ddp_job(spark, out, 16000, free_the_slot, np=2, min_np=2, max_np=4)

    entries, last_before = _world_change(out, launches=range(4))
    _assert_grew_from_two_to_four(entries, last_before)
    assert result["launch"] == 0 and result["generation"] == 1 and result["equal"]
    assert result["lr"] == LR * 4
    _rows_read_once(out, range(4), rows=16000, restored=last_before)
    job = runner.last_job
    assert job.attempts == 1 and job.failures == [] and len(job.reformed) == 1
    assert job.reformed[0].startswith("grew")
    assert still_alive(runner) == []
