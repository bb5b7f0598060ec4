"""In-process elastic worlds, the driver's side (issue 40), on real Spark (local-cluster,
two one-core executors, the session's): ranks that speak the protocol themselves
(`messages.ElasticWorld` over their driver channel, as `sparkdist.elastic.run` does) in
a minimal loop: enter, write a marker of each generation they are in (with their pid),
poll for a newer one, return once the test says stop.

* a rank killed by the test: the survivors keep their processes, the next generation
  has them (world rank 0 a survivor), the job's result is its members[0]'s, and nothing
  is relaunched;
* a task standing by (a slot another Spark job held, then freed): seated into the
  running attempt with fresh launch ranks, the next generation includes them;
* a task lost (its Python worker killed): its ranks are left behind, and Spark's retry of
  the task is seated back;
* a loss before every rank entered: relaunched as ever (below min_np the world waits for
  its slots: `test_elastic_below_min_np.py`);
* max_failures counts a loss re-formed in process: the next one fails the job;
* the protocol itself on a real `DriverService` (no Spark).

Two ranks per task (`ranks_per_task=2`) give a world of four ranks on the two slots.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from helpers import SlotHolder, still_alive, wait_for

import sparkdist
from sparkdist.errors import RankFailedError
from sparkdist.runner.driver.failures import FAILURE_SETTLE_S
from sparkdist.trace import format, validate


def elastic_loop(out: str) -> dict | None:
    """A rank's minimal in-process loop: each generation it is in goes to a marker
    file; not a member any more, it leaves (returns None); else it returns its last
    world once `out/stop` exists."""
    import psutil

    from sparkdist.protocol import messages
    from sparkdist.protocol.driver_channel import driver_client

    client, rank, pid = driver_client(), int(os.environ["RANK"]), os.getpid()
    write_whole(Path(out, f"pid-{rank}"), str(pid))
    # The Spark task's Python worker: the parent of this rank's supervisor.
    write_whole(Path(out, f"task-pid-{rank}"), str(psutil.Process(os.getppid()).ppid()))
    reply = client.request(messages.ElasticWorld(rank, -1, 60.0))
    assert isinstance(reply, messages.Ok), reply
    world, deadline = as_marker(reply.value), time.monotonic() + 240
    while True:
        marker = {**world, "pid": pid, "time": time.time()}
        write_whole(Path(out, f"gen{world['generation']}-rank{rank}.json"), json.dumps(marker))
        if rank not in world["members"]:
            return None
        while not Path(out, "stop").exists():
            reply = client.request(messages.ElasticWorld(rank, world["generation"], 0))
            if isinstance(reply, messages.Ok):
                world = as_marker(reply.value)
                break
            assert time.monotonic() < deadline, "the test never said stop"
            time.sleep(0.05)
        else:
            return {**marker, "rank": rank}


def as_marker(generation) -> dict:
    """A `messages.Generation` as the JSON marker the test reads back."""
    return {
        "generation": generation.number,
        "members": list(generation.members),
        "reason": generation.reason,
    }


def write_whole(path: Path, text: str) -> None:
    """Write `text` at `path` so that a reader never sees it half written."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def run_beside(action, runner, out: Path, main=None, join_s: float = 5.0):
    """Run `main` (default `elastic_loop`) with `runner` while `action()` (what the test
    does to the world: kill, free a slot, say stop) runs in a thread beside it."""
    beside = threading.Thread(target=action, daemon=True)
    beside.start()
    try:
        return runner.run(main or elastic_loop, out=str(out))
    finally:
        beside.join(timeout=join_s)


def markers(out: Path, generation: int) -> dict[int, dict]:
    """The markers of `generation`, by launch rank."""
    found = {}
    for path in out.glob(f"gen{generation}-rank*.json"):
        found[int(path.stem.split("rank")[1])] = json.loads(path.read_text())
    return found


def test_killed_rank_leaves_the_survivors_running(sc, tmp_path, caplog):
    out = tmp_path

    def kill_rank_0_then_stop() -> None:
        wait_for(lambda: len(markers(out, 0)) == 4, "generation 0 entered by every rank")
        killed_at.append(time.time())
        os.kill(int((out / "pid-0").read_text()), signal.SIGKILL)
        wait_for(lambda: len(markers(out, 1)) == 3, "generation 1 seen by the survivors")
        # The lost rank's late reports (its supervisor's exit) must not fail the job,
        # which they would once they settled.
        time.sleep(FAILURE_SETTLE_S + 1)
        (out / "stop").touch()

    killed_at: list[float] = []
    runner = sparkdist.HorovodRunner(np=4, min_np=2, max_np=4, ranks_per_task=2)
    with caplog.at_level("WARNING", logger="sparkdist.runner.driver"):
        result = run_beside(kill_rank_0_then_stop, runner, out)

    before, after = markers(out, 0), markers(out, 1)
    assert before[0]["members"] == [0, 1, 2, 3]
    assert sorted(after) == [1, 2, 3]
    for rank, marker in after.items():
        assert marker["members"] == [1, 2, 3]  # survivors in order: world rank 0 is rank 1
        assert marker["pid"] == before[rank]["pid"]  # the same process as before
    assert "SIGKILL" in after[1]["reason"] and "rank 0" in after[1]["reason"]
    # The job's result is world rank 0's of the last generation: launch rank 1's.
    assert result == {**after[1], "rank": 1}
    seen = max(m["time"] for m in after.values()) - killed_at[0]
    print(f"in process: {seen:.2f} s from the kill to generation 1 on every survivor")
    job = runner.last_job
    assert job.launcher == "direct"  # auto is direct for an elastic job
    assert job.attempts == 1 and job.failures == []
    assert len(job.reformed) == 1 and "SIGKILL" in job.reformed[0]
    changes = [r.getMessage() for r in caplog.records if "in process" in r.getMessage()]
    assert len(changes) == 1 and "world 4 -> 3 ranks in process: rank 0" in changes[0]
    assert still_alive(runner) == []


def test_lost_task_leaves_its_ranks_behind_and_its_retry_joins_back(sc, tmp_path):
    """The Python worker of the task that holds ranks 2 and 3 is killed (a lost executor,
    in miniature): the world goes on with ranks 0 and 1 in their processes; Spark runs
    the task again, it checks in, and is seated back with fresh launch ranks 4 and 5."""
    out = tmp_path

    def kill_task_then_stop() -> None:
        wait_for(lambda: len(markers(out, 0)) == 4, "generation 0 entered by every rank")
        os.kill(int((out / "task-pid-2").read_text()), signal.SIGKILL)
        wait_for(lambda: len(markers(out, 2)) == 4, "generation 2 seen by every rank", 180)
        (out / "stop").touch()

    runner = sparkdist.HorovodRunner(np=4, min_np=2, max_np=4, ranks_per_task=2)
    result = run_beside(kill_task_then_stop, runner, out)

    first, shrunk, grown = markers(out, 0), markers(out, 1), markers(out, 2)
    assert sorted(shrunk) == [0, 1] and shrunk[0]["members"] == [0, 1]
    assert "lost contact with rank 2" in shrunk[0]["reason"]
    assert sorted(grown) == [0, 1, 4, 5] and grown[0]["members"] == [0, 1, 4, 5]
    for rank in (0, 1):
        assert first[rank]["pid"] == shrunk[rank]["pid"] == grown[rank]["pid"]
    assert result == {**grown[0], "rank": 0}
    job = runner.last_job
    assert job.attempts == 1 and job.failures == []
    assert len(job.reformed) == 2 and job.reformed[1].startswith("grew: 2 more rank slot(s)")
    assert still_alive(runner) == []
    trace = _assert_traced_world(job, sizes=[4, 2, 4], lost="lost contact with rank 2")
    # The lost task's ranks end where they were lost, with a failure saying why; its
    # retry's ranks were scheduled again from then, not from the stage's start.
    events = trace["traceEvents"]
    changes = [e["ts"] for e in events if e["name"] == "world change"]
    for rank in (2, 3):
        pid = format.rank_pid(rank)
        (failure,) = [e for e in events if e["name"] == "failure" and e["pid"] == pid]
        assert "lost contact with" in failure["args"]["reason"]
        (main,) = [e for e in events if e["pid"] == pid and e["name"] == "main"]
        assert main["ts"] + main["dur"] <= changes[0] + 1e6, (main, changes)
    for rank in (4, 5):
        pid = format.rank_pid(rank)
        (scheduled,) = [e for e in events if e["pid"] == pid and e["name"] == "scheduled"]
        assert scheduled["ts"] >= min(e["ts"] for e in events if e["name"] == "failure")
    assert trace["otherData"]["sparkdist"]["np"] == 4


def _assert_traced_world(job, sizes: list[int], lost: str) -> dict:
    """The job's trace (issue 63): the world-size counter goes through `sizes`, each
    generation is a slice on the driver's track, each change an instant saying why."""
    trace = json.loads(Path(job.trace).read_text())
    validate.check(trace)
    events = trace["traceEvents"]
    counted = [e["args"]["ranks"] for e in events if e["name"] == "world size"]
    assert counted == sizes, counted
    driver = [e for e in events if e["pid"] == format.DRIVER]
    generations = [e for e in driver if e["ph"] == "X" and e["tid"] == format.GENERATIONS]
    assert [(g["name"], g["args"]["ranks"]) for g in generations] == [
        (f"generation {n}", size) for n, size in enumerate(sizes)
    ]
    for before, after in zip(generations, generations[1:], strict=False):
        assert before["ts"] + before["dur"] <= after["ts"] + 0.2  # one after another
    changes = [e for e in driver if e["name"] == "world change"]
    assert [c["args"]["ranks"] for c in changes] == sizes[1:]
    assert lost in changes[0]["args"]["why"]
    return trace


def test_task_standing_by_joins_the_running_world(sc, tmp_path):
    out = tmp_path / "ranks"
    out.mkdir()
    holder = SlotHolder(sc, tmp_path, slots=1)

    def free_slot_then_stop() -> None:
        wait_for(lambda: len(markers(out, 0)) == 2, "generation 0 entered")
        holder.release()
        wait_for(lambda: len(markers(out, 1)) == 4, "generation 1 seen by every rank", 180)
        (out / "stop").touch()

    runner = sparkdist.HorovodRunner(np=2, min_np=2, max_np=4, ranks_per_task=2)
    result = run_beside(free_slot_then_stop, runner, out)

    before, after = markers(out, 0), markers(out, 1)
    assert sorted(before) == [0, 1] and before[0]["members"] == [0, 1]
    assert sorted(after) == [0, 1, 2, 3]
    assert all(m["members"] == [0, 1, 2, 3] for m in after.values())
    assert [after[r]["pid"] for r in (0, 1)] == [before[r]["pid"] for r in (0, 1)]
    assert "ranks [2, 3] joined" in after[0]["reason"]
    assert result == {**after[0], "rank": 0}
    job = runner.last_job
    assert job.attempts == 1 and job.failures == []
    assert len(job.reformed) == 1 and job.reformed[0].startswith("grew: 2 more rank slot(s)")
    assert still_alive(runner) == []


def killed_in_first_attempt(out: str) -> str:
    """In the first attempt rank 0 enters in-process elastic code and rank 1, which has
    not, is killed; the relaunched attempt just returns."""
    from sparkdist import checkpoint
    from sparkdist.protocol import messages
    from sparkdist.protocol.driver_channel import driver_client

    rank, client = int(os.environ["RANK"]), driver_client()
    if checkpoint.attempt() > 0:
        return f"attempt {checkpoint.attempt()}"
    if rank == 0:
        assert isinstance(client.request(messages.ElasticWorld(rank, -1, 60.0)), messages.Ok)
        Path(out, "entered-0").touch()
        while True:  # until the job aborts this attempt
            client.request(messages.ElasticWorld(0, 0, 5.0))
    while not Path(out, "entered-0").exists():
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)


def test_loss_before_every_rank_entered_relaunches(sc, tmp_path):
    """A rank lost before every rank entered elastic code: the job relaunches as it always
    did (a loss that leaves fewer than min_np waits for slots first, and relaunches when
    none comes back in time: `test_elastic_below_min_np.py`)."""
    runner = sparkdist.HorovodRunner(np=2, min_np=1, max_np=2)
    result = runner.run(killed_in_first_attempt, out=str(tmp_path))
    assert result == "attempt 1"
    job = runner.last_job
    assert job.attempts == 2 and job.reformed == []
    assert len(job.failures) == 1 and "SIGKILL" in job.failures[0]
    assert still_alive(runner) == []


def test_in_process_losses_count_against_max_failures(sc, tmp_path):
    """max_failures=1: the first loss re-forms the world in process and spends it; the
    second fails the job (no relaunch left either)."""
    out = tmp_path

    def kill(rank: int) -> None:
        os.kill(int((out / f"pid-{rank}").read_text()), signal.SIGKILL)

    def kill_twice() -> None:
        wait_for(lambda: len(markers(out, 0)) == 4, "generation 0 entered by every rank")
        kill(3)
        wait_for(lambda: len(markers(out, 1)) == 3, "generation 1 seen by the survivors")
        kill(2)

    runner = sparkdist.HorovodRunner(np=4, min_np=2, max_np=4, ranks_per_task=2, max_failures=1)
    with pytest.raises(RankFailedError) as err:
        run_beside(kill_twice, runner, out)
    assert err.value.rank == 2 and err.value.exit_code == -signal.SIGKILL
    job = runner.last_job
    assert job.attempts == 1 and job.failures == []
    assert len(job.reformed) == 1 and "rank 3" in job.reformed[0]
    assert still_alive(runner) == []


def test_driver_answers_elastic_world_requests_as_generations_form():
    """The protocol on a real `DriverService`, without Spark: entry, a poll, a waiter
    answered when the loop re-forms the world after a loss, a newcomer answered only
    with a generation that includes it, a rank no longer a member, the job's stop."""
    from driver_peers import elastic_driver, reply, send

    from sparkdist.protocol import messages

    with elastic_driver(3, min_np=2) as peers:
        state, ranks = peers.state, peers.ranks
        assert isinstance(ranks[1].request(messages.ElasticWorld(1, 0, 0)), messages.Missing)
        assert isinstance(ranks[1].request(messages.ElasticWorld(1, 0, 0.2)), messages.Missing)
        # Ranks 1 and 2 wait for the next generation; rank 0 is lost (SIGKILL).
        for rank in (1, 2):
            send(ranks[rank], messages.ElasticWorld(rank, 0, 30.0))
        state.losses.rank_exited(0, -signal.SIGKILL, [])
        assert sorted(state.membership.pending) == [0] and state.failures.stopping is None
        assert state.membership.can_shrink()
        state.membership.shrink()  # as the loop of attempts decides
        for rank in (1, 2):
            formed = reply(ranks[rank])
            assert formed.value.number == 1 and formed.value.members == (1, 2)
            assert "rank 0" in formed.value.reason and "SIGKILL" in formed.value.reason
        # Rank 0, were it alive, would hear it is no longer a member.
        assert ranks[0].request(messages.ElasticWorld(0, 0, 0)).value.members == (1, 2)
        # A newcomer (launch rank 3) is answered only with a generation that has it.
        state.add_ranks([3], "1 more rank slot(s) free")
        grown = peers.client(3).request(messages.ElasticWorld(3, -1, 5.0))
        assert grown.value.number == 2 and grown.value.members == (1, 2, 3)
        assert ranks[1].request(messages.ElasticWorld(1, 1, 0)) == grown
        # The job stops: a waiting rank is told.
        send(ranks[2], messages.ElasticWorld(2, 2, 30.0))
        state.stop("abort", "test over")
        stopped = reply(ranks[2])
        assert isinstance(stopped, messages.Failed) and "test over" in stopped.error


def test_a_member_waiting_for_a_store_rank_0_never_published_joins_the_newer_world():
    """Rank 0 was lost as world 0 formed, so it never publishes the world's store: rank 1,
    waiting for the store's address, meets the world the driver formed without rank 0
    (`WorldChanged`, and `elastic.run` joins it) instead of waiting out the join limit
    (twice the elastic timeout) for a world that was over, and failing then."""
    from driver_peers import elastic_driver

    from sparkdist.elastic import torch_group
    from sparkdist.elastic.generations import Generation, WorldChanged

    with elastic_driver(3, min_np=2) as peers:
        state = peers.state
        state.losses.rank_exited(0, -signal.SIGKILL, [])
        assert state.membership.can_shrink()
        state.membership.shrink()
        assert state.membership.generation.members == (1, 2)
        with pytest.raises(WorldChanged, match="generation 1 formed as 0 formed"):
            torch_group.form(Generation(0, (0, 1, 2)), 1, peers.ranks[1], limit_s=15.0)
