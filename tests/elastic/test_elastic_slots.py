"""An in-process elastic world keeps its size through faults that kill no executor (issue 64,
the chaos soak's first two findings), on real Spark (local-cluster, the session's: two
one-core executors, so two task slots and `max_np=2`).

* a rank SIGKILLed while its executor lives: its task ends and gives its slot back to
  Spark, a new task takes it and checks in, and the world grows back to two, each time
  (before, the task waited for the job's end and the world stayed at one for good);
* a world that broke with nobody lost (every member's collective timed out, here because
  one rank was stuck in its own code longer than `SPARKDIST_ELASTIC_TIMEOUT_S`, as when
  a host is cut off for less than the driver's dead-peer detection): the driver forms the
  next world from the members that say their world broke, and the job goes on (before,
  nobody was lost, no world formed, and every rank waited until the job failed);
* a world that breaks that way at the same step every time: after
  `SPARKDIST_ELASTIC_REFORM_LIMIT` re-forms with no commit between them the ranks raise
  `elastic.WorldStuck` and the job fails, naming the worlds and the step (before, it
  re-formed forever); breaks with commits between them are never capped.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from helpers import still_alive, wait_for
from test_elastic_in_process import markers, run_beside

import sparkdist
from sparkdist.errors import RankFailedError


def test_a_killed_rank_gives_its_slot_back_and_the_world_grows_back(sc, tmp_path):
    """Kill the rank of task 1, then the rank of the task that took its slot: the world
    goes 2 -> 1 -> 2 -> 1 -> 2, rank 0 in its one process throughout, and the job ends
    well in its first attempt."""
    out = tmp_path

    def kill(rank: int, generation: int) -> None:
        os.kill(int((out / f"pid-{rank}").read_text()), signal.SIGKILL)
        wait_for(lambda: markers(out, generation).keys() == {0}, f"generation {generation}")

    def grown(generation: int) -> list[int]:
        wait_for(lambda: len(markers(out, generation)) == 2, f"generation {generation}", 150)
        return markers(out, generation)[0]["members"]

    def kill_twice_then_stop() -> None:
        wait_for(lambda: len(markers(out, 0)) == 2, "generation 0 entered by both ranks")
        kill(1, 1)
        newcomer = grown(2)[1]
        kill(newcomer, 3)
        grown(4)
        (out / "stop").touch()

    runner = sparkdist.HorovodRunner(np=2, min_np=1, max_np=2)
    result = run_beside(kill_twice_then_stop, runner, out)

    worlds = [markers(out, g)[0]["members"] for g in range(5)]
    print(f"worlds: {worlds}")
    assert [len(members) for members in worlds] == [2, 1, 2, 1, 2]
    assert worlds[0] == [0, 1] and worlds[1] == [0]
    first, second = worlds[2][1], worlds[4][1]
    assert worlds[2] == [0, first] and worlds[3] == [0] and worlds[4] == [0, second]
    assert 1 < first < second  # fresh launch ranks, of the tasks that took the slot
    assert "SIGKILL" in markers(out, 1)[0]["reason"]
    assert "joined" in markers(out, 2)[0]["reason"]
    pids = {markers(out, g)[0]["pid"] for g in range(5)}
    assert len(pids) == 1  # rank 0 kept its process
    assert result == {**markers(out, 4)[0], "rank": 0}
    job = runner.last_job
    assert job.attempts == 1 and job.failures == []
    assert [r.split(":")[0] for r in job.reformed] == [
        job.reformed[0].split(":")[0],
        "grew",
        job.reformed[2].split(":")[0],
        "grew",
    ], job.reformed
    assert still_alive(runner) == []


def stuck_once(out: str, steps: int, stuck_s: float) -> dict:
    """A gloo `all_reduce` and a commit a step in `sparkdist.elastic.run`; at step 3, launch
    rank 1 sleeps `stuck_s` in its own code (once), longer than the collective timeout, so
    that rank 0's `all_reduce` times out and then rank 1's fails on the freed group."""
    import torch
    import torch.distributed as dist

    from sparkdist import elastic

    launch_rank = int(os.environ["RANK"])
    stuck = Path(out, "stuck")

    @elastic.run
    def train(state) -> dict:
        Path(out, f"gen{state.generation}-rank{launch_rank}").write_text(str(os.getpid()))
        value = torch.ones(1)
        while state.step < steps:
            if state.step == 3 and launch_rank == 1 and not stuck.exists():
                stuck.write_text(str(time.time()))
                time.sleep(stuck_s)
            dist.all_reduce(value)
            state.step += 1
            state.commit()
        return {"rank": launch_rank, "size": dist.get_world_size(), "step": state.step}

    return train(elastic.ObjectState(step=0))


def test_a_world_broken_with_nobody_lost_re_forms_and_goes_on(sc, tmp_path, caplog):
    """Rank 1 is stuck for 6 s, the collective timeout is 3 s: both ranks' collectives
    fail, both say their world broke, and the driver forms generation 1 of the same two
    ranks in their processes; the job ends well, in its first attempt."""
    runner = sparkdist.HorovodRunner(
        np=2,
        min_np=1,
        max_np=2,
        timeout=150,
        env={"SPARKDIST_ELASTIC_TIMEOUT_S": "3"},
    )
    with caplog.at_level("WARNING", logger="sparkdist"):
        results = runner.run_all(stuck_once, out=str(tmp_path), steps=8, stuck_s=6.0)

    assert results == [{"rank": r, "size": 2, "step": 8} for r in (0, 1)], results
    for rank in (0, 1):  # in generation 1, in the same process as in generation 0
        before = (tmp_path / f"gen0-rank{rank}").read_text()
        assert (tmp_path / f"gen1-rank{rank}").read_text() == before
    job = runner.last_job
    assert job.attempts == 1 and job.failures == [] and job.reformed == []
    log = "\n".join(r.getMessage() for r in caplog.records)
    assert "world 2 -> 2 ranks in process: world 0 broke" in log, log
    assert still_alive(runner) == []


def stuck_at(out: str, steps: int, every_world: bool) -> dict:
    """As `stuck_once`, but launch rank 1 is stuck in its own code in every world, until
    rank 0's `all_reduce` timed out (a file rank 0 writes: no race with the timeout); then
    rank 1's fails on the group rank 0 left. At step 3 each time (`every_world`: the
    world makes no progress again), or at step 2 x (the world's number + 1), once a
    world, after that world's commits."""
    import torch
    import torch.distributed as dist

    from sparkdist import elastic

    launch_rank = int(os.environ["RANK"])

    @elastic.run
    def train(state) -> dict:
        Path(out, f"gen{state.generation}-rank{launch_rank}").write_text(str(os.getpid()))
        value, broke = torch.ones(1), Path(out, f"broke-{state.generation}")
        at = 3 if every_world else 2 * (state.generation + 1)
        while state.step < steps:
            deadline = time.monotonic() + 60
            while state.step == at and launch_rank == 1 and not broke.exists():
                assert time.monotonic() < deadline, "rank 0's all_reduce never timed out"
                time.sleep(0.05)
            try:
                dist.all_reduce(value)
            except Exception:
                broke.touch()
                raise
            state.step += 1
            state.commit()
        return {"rank": launch_rank, "generation": state.generation, "step": state.step}

    return train(elastic.ObjectState(step=0))


def stuck_runner(limit: int) -> sparkdist.HorovodRunner:
    env = {"SPARKDIST_ELASTIC_TIMEOUT_S": "2", "SPARKDIST_ELASTIC_REFORM_LIMIT": str(limit)}
    return sparkdist.HorovodRunner(np=2, min_np=1, max_np=2, timeout=120, env=env)


def test_a_world_that_breaks_at_the_same_step_every_time_fails_the_job(sc, tmp_path):
    """Rank 1 is stuck at step 3 in every world (until rank 0's collective timed out), with
    `SPARKDIST_ELASTIC_REFORM_LIMIT=2`: world 0 breaks after its commits, worlds 1 and 2
    before any; the third break in a row with no commit fails the job with an error that
    names the worlds and the step, in its first attempt (before: re-formed until the
    job's time limit)."""
    runner = stuck_runner(limit=2)
    with pytest.raises(RankFailedError) as raised:
        runner.run_all(stuck_at, out=str(tmp_path), steps=8, every_world=True)

    text = str(raised.value)
    print(next(line for line in text.splitlines() if "WorldStuck" in line))
    assert "WorldStuck" in text and "worlds [0, 1, 2] broke" in text, text
    assert "SPARKDIST_ELASTIC_REFORM_LIMIT=2" in text and "(step=3)" in text, text
    assert not (tmp_path / "gen3-rank0").exists()  # no world entered after the third break
    job = runner.last_job
    assert job.attempts == 1 and job.failures == []
    assert still_alive(runner) == []


def test_breaks_with_commits_between_them_are_never_capped(sc, tmp_path):
    """With `SPARKDIST_ELASTIC_REFORM_LIMIT=1`, worlds 0, 1 and 2 each break once after
    their own commits (at steps 2, 4 and 6): every break follows progress, so the job
    re-forms each time and ends well in world 3."""
    runner = stuck_runner(limit=1)
    results = runner.run_all(stuck_at, out=str(tmp_path), steps=8, every_world=False)

    assert results == [{"rank": r, "generation": 3, "step": 8} for r in (0, 1)], results
    job = runner.last_job
    assert job.attempts == 1 and job.failures == []
    assert still_alive(runner) == []


def test_driver_forms_the_next_world_once_every_member_says_it_broke():
    """The protocol on a real `DriverService`, without Spark: members that say their world
    broke wait until the last one says so too, then all get the next generation of the
    same members; while a loss is pending, the loss (the loop's shrink) forms it instead."""
    from driver_peers import elastic_driver, reply, send

    from sparkdist.protocol import messages

    with elastic_driver(3, min_np=1) as peers:
        state, ranks = peers.state, peers.ranks
        broke = [messages.ElasticWorld(rank, 0, 0.3, broke=True) for rank in range(3)]
        assert isinstance(ranks[0].request(broke[0]), messages.Missing)  # rank 1 and 2 yet to say
        send(ranks[1], broke[1]._replace(timeout_s=30.0))
        formed = ranks[2].request(broke[2])  # the last one: the next world forms at once
        assert formed.value.number == 1 and formed.value.members == (0, 1, 2)
        assert "world 0 broke with no member lost" in formed.value.reason
        assert reply(ranks[1]) == formed
        assert ranks[0].request(messages.ElasticWorld(0, 0, 0)) == formed
        # World 1 breaks under ranks 0 and 1, and rank 2 is lost: its loss forms the next.
        for rank in (0, 1):
            assert isinstance(ranks[rank].request(broke[rank]._replace(after=1)), messages.Missing)
        state.losses.rank_exited(2, -signal.SIGKILL, [])
        assert isinstance(ranks[0].request(broke[0]._replace(after=1)), messages.Missing)
        assert state.membership.generation.number == 1 and sorted(state.membership.pending) == [2]
        state.membership.shrink()  # as the loop of attempts decides
        assert ranks[1].request(broke[1]._replace(after=1)).value.members == (0, 1)


def test_a_task_beyond_the_worlds_room_is_released_at_check_in():
    """Once seated, the gang keeps standing by only as many tasks as the world can take
    (`Gang.room`): a task Spark ran again beside the one submitted in its place ends at
    once instead of holding a slot."""
    import threading

    from sparkdist.network import split_address
    from sparkdist.protocol import messages, wire
    from sparkdist.runner.driver.launch.gang import Gang

    secret = wire.new_secret()
    gang = Gang(secret, "127.0.0.1", "127.0.0.1")
    gang.room = lambda: 1
    answers: dict[int, tuple] = {}

    def check_in(task_id: int) -> None:
        channel = wire.connect(split_address(gang.address), secret)
        check = messages.GangCheckIn(task_id, "127.0.0.1", 1000 + task_id, task_id)
        answers[task_id] = messages.decode(
            channel.request(messages.encode(check)), messages.GANG_ORDERS
        )

    first = threading.Thread(target=check_in, args=(1,), daemon=True)
    first.start()
    try:
        wait_for(lambda: gang.standing_by() == 1, "the first task standing by", 30)
        check_in(2)  # beyond the room: answered at once
        assert isinstance(answers[2], messages.GangRelease) and "no room" in answers[2].reason
        assert gang.standing_by() == 1 and 1 not in answers
    finally:
        gang.close()
        first.join(timeout=10)
    assert isinstance(answers[1], messages.GangRelease)  # the attempt ended


def test_a_task_gone_between_forming_and_seating_is_seated_and_reported_lost():
    """A task whose connection closes after `Gang.form` chose it, before `Gang.seat`
    (its executor lost in that moment: test_elastic_seat_lost kills one there), is seated
    all the same and reported as a closed seat, which relaunches the world; before, its
    seating raised ValueError (it was no longer waiting) and left the gang's tasks
    running."""
    from sparkdist.network import split_address
    from sparkdist.protocol import messages, wire
    from sparkdist.runner.driver.launch.gang import Gang

    secret = wire.new_secret()
    gang = Gang(secret, "127.0.0.1", "127.0.0.1")
    closed: list[tuple[int, str]] = []
    gang.closed_seat = lambda index, host: closed.append((index, host))
    channels = []
    try:
        for task_id in (1, 2):
            channel = wire.connect(split_address(gang.address), secret)
            check = messages.GangCheckIn(task_id, "127.0.0.1", 1000 + task_id, task_id)
            channel.send(messages.encode(check))
            channels.append(channel)
        chosen = gang.form(2, 2, 30, 2, 2)
        channels[1].close()  # task 2 is lost once chosen, before it is seated
        wait_for(lambda: gang.standing_by() == 1, "the lost task taken off the list", 30)
        gang.seat(chosen, 2, "127.0.0.1:1")
        seat = messages.decode(channels[0].recv(), messages.GANG_ORDERS)
        assert isinstance(seat, messages.GangSeat) and seat.index == 0
        wait_for(lambda: closed == [(1, "127.0.0.1")], "the lost task's seat reported", 30)
        assert gang.standing_by() == 0
    finally:
        for channel in channels:
            channel.close()
        gang.close()
