"""In-process elastic training for `horovod.torch` (`elastic.HorovodState`, issue 40), end
to end on real Spark (local-cluster, two one-core executors, the session's; 2 ranks per
task, the direct launcher): Horovod re-formed in the ranks' own processes
(`hvd.shutdown()`, `hvd.init()` with a fresh Gloo rendezvous per world).

* A rank killed mid-training: the survivors restore the last commit after their Horovod
  collective fails (`HorovodInternalError`), keep their processes, redo at most one step
  and end with equal parameters.
* A slot freed mid-training: the world grows at a commit (nothing redone); the newcomers
  get the state by Horovod broadcasts from a survivor and average gradients with the rest.
* Three spawned ranks against a real `DriverService` (no Spark): a world formed by
  `horovod_world.form`; a rank later than the timeout to a collective does not fail it
  (Horovod's background threads keep talking), a killed one fails the survivors' with an
  error `elastic.run` recovers from, within the timeout.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from driver_peers import SpawnedRanks, connect_rank
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
from helpers import SlotHolder, still_alive, wait_for

from sparkdist import HorovodRunner, job_environment

LR = 0.01
TIMEOUT_S = 5.0
"""The elastic timeout of these jobs: a survivor whose pending collective waits on no
socket of the lost rank fails after it (Horovod's Gloo timeout)."""
STEPS_AFTER = 5
"""Steps each later world takes before the job ends."""


def horovod_main(out: str) -> dict:
    """`horovod.torch` training through `elastic.run` with an `elastic.HorovodState`: world 0
    steps slowly until the test changes the world, each later one `STEPS_AFTER` steps.
    Each rank logs its entries into `train` and its steps."""
    import json
    from pathlib import Path

    import horovod.torch as hvd

    from sparkdist import elastic

    hvd.init()  # as any Horovod script: elastic.run re-forms Horovod for each world
    launch, pid = int(os.environ["RANK"]), os.getpid()
    log = Path(out, f"log-{launch}.jsonl")
    model, optimizer = small_model(seed=launch)  # each rank starts different: the sync makes one
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    state = elastic.HorovodState(model=model, optimizer=optimizer, step=0)

    def write(**event) -> None:
        with log.open("a") as file:
            event.update(generation=state.generation, pid=pid, time=time.time())
            file.write(json.dumps(event) + "\n")

    def rescale() -> None:  # after a change, before the sync
        for group in state.optimizer.param_groups:
            group["lr"] = LR * hvd.size()

    state.register_reset_callbacks([rescale])

    @elastic.run
    def train(state):
        write(event="enter", step=state.step, rank=hvd.rank(), size=hvd.size())
        stop = None if state.generation == 0 else state.step + STEPS_AFTER
        while stop is None or state.step < stop:
            take_step(state.model, state.optimizer, seed=1000 * state.step + hvd.rank())
            state.step += 1
            write(event="stepped", step=state.step)
            state.commit()  # world 0's last step: raises WorldChanged (grow) or fails (loss)
            if state.generation == 0:
                assert state.step < 3000, "the test never changed the world"
                time.sleep(0.05)
        mine = flat_parameters(state).tolist()
        equal = all(other == mine for other in hvd.allgather_object(mine))
        return {
            "launch": launch,
            "pid": pid,
            "generation": state.generation,
            "size": hvd.size(),
            "lr": state.optimizer.param_groups[0]["lr"],
            "equal": equal,
        }

    return train(state)


def _horovod_job(out, beside, **options):
    """`horovod_main` as an elastic job (2 ranks per task, direct) while `beside()` runs
    in a thread: the runner and the job's result."""
    thread = threading.Thread(target=beside, daemon=True)
    thread.start()
    runner = HorovodRunner(
        ranks_per_task=2,
        launcher="direct",
        env={job_environment.ELASTIC_TIMEOUT_S: str(TIMEOUT_S)},
        **options,
    )
    result = runner.run(horovod_main, out=str(out))
    thread.join(timeout=5)
    return runner, result


def _steps(out, launch: int) -> list[int]:
    return [e["step"] for e in launch_events(out, launch) if e["event"] == "stepped"]


def test_horovod_survivors_keep_their_processes_when_a_rank_is_killed(sc, tmp_path):
    """4 ranks, min_np=2: launch rank 0 (world rank 0: it served the rendezvous and sent
    the state) is killed mid-training; ranks 1-3 re-form Horovod in their processes as
    world 0-2, from their last commit (at most one step redone), with equal parameters."""

    def kill_rank_0() -> None:
        wait_for(lambda: all(len(_steps(tmp_path, r)) >= 3 for r in range(4)), "3 steps")
        os.kill(next(e["pid"] for e in launch_events(tmp_path, 0)), signal.SIGKILL)
        killed_at.append(time.time())

    killed_at: list[float] = []
    runner, result = _horovod_job(tmp_path, kill_rank_0, np=4, min_np=2, max_np=4)

    entries, last_before = world_change(tmp_path, launches=range(4))
    assert [e["generation"] for e in entries[0]] == [0]
    for launch in (1, 2, 3):
        first, again = entries[launch]
        assert (first["generation"], first["rank"], first["size"]) == (0, launch, 4)
        assert again["generation"] == 1 and again["pid"] == first["pid"]  # the same process
        assert (again["rank"], again["size"]) == (launch - 1, 3)  # Horovod's new place
        assert last_before - again["step"] <= 1  # at most one step redone
    assert result["launch"] == 1 and result["generation"] == 1 and result["size"] == 3
    assert result["equal"]  # parameters equal on every rank
    assert result["lr"] == LR * 3  # the reset callback ran, in the world of 3
    job = runner.last_job
    assert job.attempts == 1 and job.failures == [] and len(job.reformed) == 1
    assert "rank 0" in job.reformed[0]
    assert still_alive(runner) == []
    resumed = min(
        e["time"]
        for e in launch_events(tmp_path, 1)
        if e["generation"] == 1 and e["event"] == "stepped"
    )
    recovery = resumed - killed_at[0]
    print(f"horovod in process: {recovery:.2f} s from the kill to world 1's first step")
    assert recovery < TIMEOUT_S + 10.0  # a survivor waits out at most one Gloo timeout


def test_horovod_world_grows_at_a_commit_and_newcomers_get_the_state(sc, tmp_path):
    """2 ranks on one task while another Spark job holds the second slot; once it frees the
    slot, 2 more ranks join: the running ranks stop at a commit (nothing redone) and keep
    their processes, and the newcomers start from their state by Horovod broadcasts."""
    out = tmp_path / "ranks"
    out.mkdir()
    holder = SlotHolder(sc, tmp_path, slots=1)

    def free_the_slot() -> None:
        wait_for(lambda: all(len(_steps(out, r)) >= 3 for r in range(2)), "3 steps")
        holder.release()

    runner, result = _horovod_job(out, free_the_slot, np=2, min_np=2, max_np=4)

    entries, last_before = world_change(out, launches=range(4))
    assert_grew_from_two_to_four(entries, last_before)
    assert result["launch"] == 0 and result["generation"] == 1 and result["size"] == 4
    assert result["equal"] and result["lr"] == LR * 4
    job = runner.last_job
    assert job.attempts == 1 and job.failures == [] and len(job.reformed) == 1
    assert job.reformed[0].startswith("grew")
    assert still_alive(runner) == []


# --- rank processes against a real driver service ------------------------------------


def _late_or_killed_rank(rank, world_size, address, secret_text, extra) -> None:
    """Form a Horovod world of `world_size`; the last rank comes late to the second
    allreduce ("late", by twice the timeout) or waits for the test to kill it ("killed").
    Exit code 0: the allreduce summed; 3: it failed as a broken world's does."""
    import horovod.torch as hvd
    import torch

    from sparkdist.elastic import horovod_world
    from sparkdist.elastic.generations import Generation
    from sparkdist.protocol import driver_channel

    how, in_collective = extra
    connect_rank(rank, world_size, address, secret_text)
    client = driver_channel.driver_client()
    horovod_world.form(Generation(0, tuple(range(world_size))), rank, client, TIMEOUT_S)
    assert (hvd.rank(), hvd.size()) == (rank, world_size)
    hvd.allreduce(torch.ones(2), op=hvd.Sum, name="first")  # the world works
    in_collective[rank].set()
    if rank == world_size - 1:
        time.sleep(2 * TIMEOUT_S if how == "late" else 3600)
    try:
        total = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="second")
    except Exception as exc:  # noqa: BLE001 - the test checks which
        os._exit(COLLECTIVE_FAILED if horovod_world.is_collective_failure(exc) else 4)
    os._exit(0 if total.tolist() == [world_size] * 2 else 5)


@pytest.mark.parametrize("how", ["late", "killed"])
def test_a_horovod_collective_waits_for_a_late_peer_and_fails_on_a_lost_one(how):
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    in_collective = [context.Event() for _ in range(3)]
    ranks = SpawnedRanks(3, _late_or_killed_rank, (how, in_collective))
    try:
        for event in in_collective:
            assert event.wait(START_S)
        began = time.monotonic()
        if how == "killed":
            os.kill(ranks.procs[2].pid, signal.SIGKILL)
        survivors = ranks.procs if how == "late" else ranks.procs[:2]
        for proc in survivors:
            proc.join(max(0.0, began + 2 * TIMEOUT_S + 10 - time.monotonic()))
        codes = [proc.exitcode for proc in survivors]
        took = time.monotonic() - began
    finally:
        ranks.close()
    if how == "late":
        assert codes == [0, 0, 0]  # the late rank failed nobody's allreduce
        assert took >= 2 * TIMEOUT_S * 0.9
    else:
        assert codes == [COLLECTIVE_FAILED] * 2
        assert took < TIMEOUT_S + 3.0  # the lost peer's sockets, or the Gloo timeout
