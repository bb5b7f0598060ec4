"""What the driver does with a decommission notice (issue 41), on its real service and
job state, without Spark (the notices themselves, from a real standalone cluster's
decommissioned worker, are tested in tests/cluster/test_elastic_cluster.py):

* relaunch path: rank 0's `checkpoint.save(..., every=N)` saves at once when a notice is
  pending, and ends the attempt as a resize that says it left (not a failure);
* in process: the leaving members go at their next commit, the next generation is formed
  without them (planned: no collective aborted), and their end is no failure;
* a notice during a sharded save: that save completes (or the next one is taken at once),
  and the checkpoint resumed is always a whole one.
"""

from __future__ import annotations

import signal
import time

import pytest
from driver_peers import rank_client

from sparkdist import checkpoint
from sparkdist.checkpoint.driver.store import CheckpointStore
from sparkdist.checkpoint.rank import driver_record
from sparkdist.protocol import driver_channel, messages, wire
from sparkdist.runner.driver.failures import WorldChange, WorldResize
from sparkdist.runner.driver.job_spec import JobSpec
from sparkdist.runner.driver.job_state import JobState
from sparkdist.runner.driver.service import DriverService

NOTICE = "executor 2 on host 10.0.0.12 is being decommissioned (ranks [2])"


def wait(state: JobState) -> None:
    state.failures.wait(None, time.monotonic() + 30, launcher_expected=False)


def test_relaunch_path_saves_at_the_notice_and_resizes_without_a_failure(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path / "checkpoints")
    state = JobState(JobSpec("job", 3, b"payload", False, "none"), checkpoints=store)
    secret = wire.new_secret()
    service = DriverService(state, secret, "127.0.0.1", "127.0.0.1")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setattr(driver_channel, "_client", rank_client(service, secret, 0))
    try:
        assert checkpoint.save({"w": 1}, 10, every=10)  # a multiple: saved
        monkeypatch.setattr(driver_record, "_due_asked_at", float("-inf"))
        assert not checkpoint.save({"w": 2}, 11, every=10)  # nothing pending: skipped
        state.growth.request("2 more slots stayed free")
        state.growth.request(NOTICE, leave=True)  # the notice wins over a grow
        monkeypatch.setattr(driver_record, "_due_asked_at", float("-inf"))
        with pytest.raises(checkpoint.Resize):  # saved at once, then rank 0 stops
            checkpoint.save({"w": 3}, 12, every=10)
        assert store.steps() == [10, 12]
        with pytest.raises(ValueError, match="every must be an int >= 1"):
            checkpoint.save({"w": 4}, 13, every=0)
    finally:
        service.close()
        store.close()
    state.losses.rank_exited(0, 0, [])
    state.losses.task_lost(2, "10.0.0.12")  # the attempt being stopped: expected
    with pytest.raises(WorldResize, match="resuming from step 12") as resized:
        wait(state)
    assert resized.value.left and NOTICE in str(resized.value)


def test_in_process_members_leave_at_their_next_commit_without_a_failure():
    state = JobState(JobSpec("job", 3, b"payload", False, "all", in_process_min_np=2))
    membership = state.membership
    for rank in range(3):
        state.rank_records.started(rank, f"10.0.0.{10 + rank}")
        assert membership.ask(rank, -1, None) is not None  # every rank entered
    assert not membership.depart([1, 2], NOTICE)  # one rank left is fewer than min_np=2
    assert membership.depart([2], NOTICE)
    with pytest.raises(WorldChange) as change:
        wait(state)
    assert change.value.leave and not change.value.grow and NOTICE in change.value.reason
    assert membership.let_leave() == (3, 2, NOTICE)  # as the loop of attempts does
    answer = membership.ask(0, 0, None)
    why = f"{NOTICE}: leaving at their next commit"
    assert answer == messages.Ok(messages.Generation(1, (0, 1), why, planned=True))
    # The leaving rank ends cleanly; its host then dies: neither is a failure.
    state.losses.rank_exited(2, 0, [])
    state.losses.task_lost(2, "10.0.0.12")
    state.losses.rank_exited(2, -signal.SIGKILL, [])
    for rank in (0, 1):
        state.rank_result(rank, b"result", [])
        state.losses.rank_exited(rank, 0, [])
    wait(state)  # succeeded
    assert state.results() == [(0, b"result"), (1, b"result")]


def test_a_notice_during_a_sharded_save_stops_at_a_whole_checkpoint(tmp_path, monkeypatch):
    """A notice that arrives while a sharded (async) save is being written: that save
    completes and the rank stops there, or, if it was committed before the notice, the
    next `save(..., every=N)` saves at once; either way the newest commit is whole and
    loads, and a half-written step is never the one resumed (one rank, real DCP shards)."""
    import torch
    import torch.distributed as dist

    store = CheckpointStore(tmp_path / "checkpoints")
    state = JobState(JobSpec("job", 1, b"payload", False, "none"), checkpoints=store)
    secret = wire.new_secret()
    service = DriverService(state, secret, "127.0.0.1", "127.0.0.1")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setattr(driver_channel, "_client", rank_client(service, secret, 0))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    weights = {"w": torch.arange(4096.0)}
    try:
        assert checkpoint.save(weights, 10, sharded=True, every=10)  # committed: step 10
        weights["w"] += 1
        checkpoint.save(weights, 11, sharded=True, async_save=True)  # being written
        state.growth.request(NOTICE, leave=True)  # the notice arrives meanwhile
        stopped_at = None
        try:
            checkpoint.wait()  # written and committed; "grow" if the notice came first
        except checkpoint.Resize as stop:
            stopped_at = stop.step
        if stopped_at is None:  # committed before the notice: the next step saves at once
            weights["w"] += 1
            monkeypatch.setattr(driver_record, "_due_asked_at", float("-inf"))
            with pytest.raises(checkpoint.Resize) as stop:
                checkpoint.save(weights, 12, sharded=True, every=10)
            stopped_at = stop.value.step
        assert store.steps()[-1] == stopped_at in (11, 12)
        into = {"w": torch.zeros(4096)}
        found = checkpoint.resume(into=into)
        assert found.step == stopped_at
        assert torch.equal(into["w"], torch.arange(4096.0) + (stopped_at - 10))
    finally:
        dist.destroy_process_group()
        service.close()
        store.close()


def test_the_gang_never_seats_a_task_on_a_leaving_executor():
    """Tasks that checked in before their executor's notice (Spark starts none there
    after it) are released, never seated: neither when a world forms nor at a grow."""
    import threading

    from sparkdist.network import split_address
    from sparkdist.runner.driver.launch.gang import Gang

    leaving = {7, 9}  # Spark task attempt ids whose executor is being decommissioned
    secret = wire.new_secret()
    gang = Gang(secret, "127.0.0.1", "127.0.0.1", leaving=lambda task_id: task_id in leaving)
    answers: dict[int, tuple] = {}

    def check_in(task_id: int) -> None:
        channel = wire.connect(split_address(gang.address), secret)
        check = messages.GangCheckIn(task_id, "127.0.0.1", 1000 + task_id, task_id)
        answers[task_id] = messages.decode(
            channel.request(messages.encode(check)), messages.GANG_ORDERS
        )

    threads = [threading.Thread(target=check_in, args=(t,), daemon=True) for t in (5, 7)]
    for thread in threads:
        thread.start()
    try:
        chosen = gang.form(1, 2, 30.0, 1, 2)
        assert [a.check_in.spark_task_id for a in chosen] == [5]
        gang.seat(chosen, 1, "127.0.0.1:1")
        late = [threading.Thread(target=check_in, args=(t,), daemon=True) for t in (8, 9)]
        for thread in late:
            thread.start()
        deadline = time.monotonic() + 30
        while gang.standing_by() < 1 or 9 not in answers:  # 9 is released as it waits
            assert time.monotonic() < deadline, answers
            time.sleep(0.05)
        assert gang.seat_standing(2, 1, 1, "127.0.0.1:1", lambda indexes: None) == 1
        for thread in threads + late:
            thread.join(10)
    finally:
        gang.close()
    assert isinstance(answers[5], messages.GangSeat) and isinstance(answers[8], messages.GangSeat)
    assert isinstance(answers[7], messages.GangRelease) and isinstance(
        answers[9], messages.GangRelease
    )
    assert "decommissioned" in answers[7].reason
