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
from driver_peers import ELASTIC_TIMEOUT_S, SpawnedRanks, connect_rank
from elastic_worlds import (
    COLLECTIVE_FAILED,
    START_S,
    assert_grew_from_two_to_four,
    flat_parameters,
    launch_events,
    small_model,
    take_step,
    world_change,
)

from sparkdist import elastic, job_environment
from sparkdist.elastic import torch_group
from sparkdist.elastic.generations import Generation
from sparkdist.protocol import driver_channel


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
    model, optimizer = small_model(0)
    follower = _Follower()
    state = elastic.TorchState(model=model, optimizer=optimizer, step=0, history=[1], data=follower)
    take_step(model, optimizer, 1)
    state.step, follower.position = 1, 16
    state.history.append(2)
    state.commit()  # outside elastic.run: a local commit, no world to check
    committed = flat_parameters(state).clone()
    moments = optimizer.state_dict()["state"][0]["exp_avg"].clone()
    for attempt in range(2):  # a restored state trained on must not change the commit
        take_step(model, optimizer, 2 + attempt)
        state.step, follower.position = 5, 99
        state.history.append(3)
        assert not torch.equal(flat_parameters(state), committed)
        state.restore()
        assert torch.equal(flat_parameters(state), committed)
        assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], moments)
        assert (state.step, state.history, follower.position) == (1, [1, 2], 16)
    assert state.data is follower  # a stateful value is loaded in place, not replaced
    state.announce_world()
    assert follower.places == [(0, 1)]
    assert isinstance(elastic.ObjectState(a=1), elastic.State)


def test_a_commit_overwrites_the_last_commits_tensors_instead_of_allocating():
    model, optimizer = small_model(0)
    state = elastic.TorchState(model=model, optimizer=optimizer, step=0)
    take_step(model, optimizer, 1)
    state.commit()  # the first commit with optimizer moments: new tensors
    weight = state._saved["model"]["0.weight"]
    moments = state._saved["optimizer"]["state"][0]["exp_avg"]
    buffers = weight.untyped_storage().data_ptr(), moments.untyped_storage().data_ptr()
    take_step(model, optimizer, 2)
    state.step = 2
    state.commit()
    again = state._saved["model"]["0.weight"], state._saved["optimizer"]["state"][0]["exp_avg"]
    assert tuple(t.untyped_storage().data_ptr() for t in again) == buffers
    committed = flat_parameters(state).clone()
    take_step(model, optimizer, 3)
    state.restore()  # the overwritten commit is the newest one, and a restore keeps it
    assert torch.equal(flat_parameters(state), committed) and state.step == 2
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


def _train_rank(rank, world_size, address, secret_text, results) -> None:
    import torch.distributed as dist

    connect_rank(rank, world_size, address, secret_text)
    model, optimizer = small_model(seed=rank)  # each rank starts different: sync makes them one
    follower = _Follower()
    state = elastic.TorchState(model, optimizer, step=0, owner=f"rank {rank}", data=follower)

    @elastic.run
    def train(state):
        entered = flat_parameters(state)
        ddp = torch.nn.parallel.DistributedDataParallel(state.model)
        while state.step < 3:
            take_step(ddp, state.optimizer, seed=100 * state.step + state.rank)
            state.step += 1
            follower.position += 16
            state.commit()
        committed = flat_parameters(state)
        take_step(state.model, state.optimizer, seed=7)  # a step past the commit, rolled back
        state.restore()
        state.sync()
        gathered = [torch.zeros_like(committed) for _ in range(state.world_size)]
        dist.all_gather(gathered, committed)
        same = [torch.equal(g, gathered[0]) for g in gathered]
        return (
            entered.tolist(),
            torch.equal(flat_parameters(state), committed),
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

    connect_rank(rank, world_size, address, secret_text)
    client = driver_channel.driver_client()
    torch_group.form(Generation(0, tuple(range(world_size))), rank, client, ELASTIC_TIMEOUT_S)
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

    connect_rank(rank, world_size, address, secret_text)
    client = driver_channel.driver_client()
    for number in range(WORLDS):
        members = tuple(range(world_size))
        group = torch_group.form(Generation(number, members), rank, client, ELASTIC_TIMEOUT_S)
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


def test_run_forms_a_gloo_group_syncs_from_rank_zero_and_trains():
    results = multiprocessing.get_context("spawn").Queue()
    ranks = SpawnedRanks(3, _train_rank, results)
    try:
        got = dict(results.get(timeout=START_S) for _ in range(3))
        for proc in ranks.procs:
            proc.join(START_S)
            assert proc.exitcode == 0
    finally:
        ranks.close()
    initial_zero = flat_parameters(elastic.TorchState(small_model(seed=0)[0])).tolist()
    for rank, (entered, restored, same, owner, step, places, world_rank, size) in got.items():
        assert entered == pytest.approx(initial_zero)  # every rank starts from rank 0's model
        assert restored and all(same)  # back to the commit; parameters equal on every rank
        assert (owner, step, world_rank, size) == ("rank 0", 3, rank, 3)
        assert places == [(rank, 3)]  # the loader-like value heard where it is


def test_ending_worlds_frees_their_groups_without_waiting_for_the_gil():
    results = multiprocessing.get_context("spawn").Queue()
    ranks = SpawnedRanks(2, _end_worlds_rank, results)
    try:
        got = dict(results.get(timeout=START_S) for _ in range(2))
        for proc in ranks.procs:
            proc.join(START_S)
            assert proc.exitcode == 0
    finally:
        ranks.close()
    assert got == {0: 0, 1: 0}  # every world's group freed: its threads ended, sockets closed


def _failed_once_rank(rank, world_size, address, secret_text, results) -> None:
    """Rank 1's first world fails to form (its peer never connects: a peer lost as the
    world formed); then both form the next world, as a survivor and a newcomer would."""
    import datetime

    import torch.distributed as dist

    connect_rank(rank, world_size, address, secret_text)
    client = driver_channel.driver_client()
    if rank == 1:
        alone = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
        try:
            dist.init_process_group(
                "gloo", store=alone, rank=0, world_size=2, timeout=datetime.timedelta(seconds=1)
            )
        except dist.DistError:
            pass
        assert not dist.is_initialized()
    torch_group.form(Generation(1, (0, 1)), rank, client, ELASTIC_TIMEOUT_S)
    total = torch.ones(1)
    dist.all_reduce(total)
    results.put((rank, float(total)))


def test_a_member_whose_last_world_failed_to_form_meets_a_newcomer():
    """The soak's lost host and SIGKILL 2 s apart: the survivor's world failed as it
    formed, and with the newcomer seated below min_np every world broke, 50 times in 8
    minutes: torch's count of named groups (the default group's key prefix) was 1 on the
    survivor and 0 on the newcomer."""
    results = multiprocessing.get_context("spawn").Queue()
    ranks = SpawnedRanks(2, _failed_once_rank, results)
    try:
        got = dict(results.get(timeout=START_S) for _ in range(2))
    finally:
        ranks.close()
    assert got == {0: 2.0, 1: 2.0}


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_collective_is_unblocked_when_a_peer_dies_or_hangs(how):
    """A peer killed in a collective fails it at once (its sockets close); a peer that
    hangs fails it after the elastic timeout. Either way the survivors raise a broken
    group's error, which `elastic.run` recovers from."""
    context = multiprocessing.get_context("spawn")
    in_collective = [context.Event() for _ in range(3)]
    ranks = SpawnedRanks(3, _hang_rank, in_collective)
    try:
        for event in in_collective:
            assert event.wait(START_S)
        began = time.monotonic()
        os.kill(ranks.procs[2].pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        limit = 2.0 if how == "killed" else ELASTIC_TIMEOUT_S + 5.0
        for survivor in ranks.procs[:2]:
            survivor.join(max(0.0, began + limit - time.monotonic()))
            assert survivor.exitcode == COLLECTIVE_FAILED, f"{how}: survivor still waiting"
        took = time.monotonic() - began
        if how == "stopped":
            assert took >= ELASTIC_TIMEOUT_S * 0.9  # gloo waited its timeout, no less
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
    model, optimizer = small_model(seed=launch)
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
            mine = flat_parameters(state)
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


def _rows_read_once(out, launches, rows: int, restored: int) -> None:
    """Every row of the epoch was read once in the steps that count: world 0's up to the
    commit world 1 restored, and world 1's."""
    kept = Counter()
    for launch in launches:
        for event in launch_events(out, launch):
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
    from helpers import still_alive, wait_for

    def commits(launch: int) -> list[int]:
        return [e["step"] for e in launch_events(tmp_path, launch) if e["event"] == "stepped"]

    def kill_rank_0() -> None:
        wait_for(lambda: all(len(commits(r)) >= 3 for r in range(4)), "3 steps on every rank")
        os.kill(next(e["pid"] for e in launch_events(tmp_path, 0)), signal.SIGKILL)
        killed_at.append(time.time())

    killed_at: list[float] = []
    runner, result = _ddp_job(spark, tmp_path, 2000, kill_rank_0, np=4, min_np=2, max_np=4)

    entries, last_before = world_change(tmp_path, launches=range(4))
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
        e["time"]
        for e in launch_events(tmp_path, 1)
        if e["generation"] == 1 and e["event"] == "stepped"
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
    from helpers import SlotHolder, still_alive, wait_for

    out = tmp_path / "ranks"
    out.mkdir()
    holder = SlotHolder(spark.sparkContext, tmp_path, slots=1)

    def free_the_slot() -> None:
        wait_for(lambda: all(len(launch_events(out, r)) >= 4 for r in range(2)), "3 steps")
        holder.release()

    runner, result = _ddp_job(spark, out, 16000, free_the_slot, np=2, min_np=2, max_np=4)

    entries, last_before = world_change(out, launches=range(4))
    assert_grew_from_two_to_four(entries, last_before)
    assert result["launch"] == 0 and result["generation"] == 1 and result["equal"]
    assert result["lr"] == LR * 4
    _rows_read_once(out, range(4), rows=16000, restored=last_before)
    job = runner.last_job
    assert job.attempts == 1 and job.failures == [] and len(job.reformed) == 1
    assert job.reformed[0].startswith("grew")
    assert still_alive(runner) == []
