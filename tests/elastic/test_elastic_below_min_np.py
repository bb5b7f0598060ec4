"""An in-process elastic world left below min_np waits for its slots instead of relaunching
(issue 64: the chaos soak's largest cost, 28-76 s a relaunch), on real Spark (the session's
local-cluster: two one-core executors), with two ranks a task (a world of four on the two
slots), min_np=2:

* ranks 1, 2 and 3 SIGKILLed together (task 1's both ranks, and rank 0's neighbour): rank
  0 keeps its process and waits; task 1's slot comes back (the task ends well, one is
  submitted in its place) and the world re-forms in process, [0, 4, 5], from the last
  commit: no relaunch, at most the step in flight redone;
* the same faults while another Spark job takes the slot (it was queued first) and holds
  it until the attempt is gone: no world re-forms within the limit (`start_timeout`), the
  job relaunches as before, and a `stall_timeout` shorter than the wait drops and fails
  nobody meanwhile;
* the protocol on a real `DriverService` (no Spark): the survivors' requests wait, a
  newcomer's entry forms the world once min_np are in, a wait that ran out is refused.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

from helpers import pid_alive, still_alive, wait_for
from test_elastic_in_process import run_beside, write_whole

import sparkdist
from sparkdist.trace import validate

STEPS = 40
HOLD_AT = 5
"""Every rank of the first world waits after this step until the test has killed."""


def train_through_faults(out: str) -> dict:
    """A gloo `all_reduce` and a commit a step in `sparkdist.elastic.run`; each committed
    step goes to `steps-<attempt>-<rank>.jsonl` (generation, world size, pid, time). The
    first attempt's first world waits at step HOLD_AT for the test's faults."""
    import torch
    import torch.distributed as dist

    from sparkdist import checkpoint, elastic

    launch_rank, attempt = int(os.environ["RANK"]), checkpoint.attempt()
    write_whole(Path(out, f"pid-{attempt}-{launch_rank}"), str(os.getpid()))
    log = Path(out, f"steps-{attempt}-{launch_rank}.jsonl")
    killed = Path(out, "killed")

    @elastic.run
    def train(state) -> dict:
        value = torch.ones(1)
        while state.step < STEPS:
            dist.all_reduce(value)
            state.step += 1
            line = {
                "step": state.step,
                "generation": state.generation,
                "size": dist.get_world_size(),
                "pid": os.getpid(),
                "time": time.time(),
            }
            with log.open("a") as f:
                f.write(json.dumps(line) + "\n")
            state.commit()
            while attempt == 0 and state.generation == 0 and not killed.exists():
                if state.step < HOLD_AT:
                    break
                time.sleep(0.05)
            time.sleep(0.05)
        return {"rank": launch_rank, "step": state.step, "size": dist.get_world_size()}

    return train(elastic.ObjectState(step=0))


def steps(out: Path, attempt: int, rank: int) -> list[dict]:
    path = out / f"steps-{attempt}-{rank}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def kill_three(out: Path) -> float:
    """Once every rank of the first world waits at HOLD_AT: SIGKILL ranks 1, 2 and 3
    together (rank 0 is left, below min_np=2); when."""
    wait_for(
        lambda: all(steps(out, 0, r) and steps(out, 0, r)[-1]["step"] >= HOLD_AT for r in range(4)),
        "every rank at the hold",
        180,
    )
    pids = [int((out / f"pid-0-{rank}").read_text()) for rank in (1, 2, 3)]
    killed_at = time.time()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    (out / "killed").touch()
    return killed_at


def test_below_min_np_the_survivor_waits_and_the_world_re_forms_in_process(sc, tmp_path, caplog):
    """Ranks 1-3 killed together: rank 0 waits in its process, task 1's slot comes back,
    and the world [0, 4, 5] goes on from the last commit, in the first attempt (on the
    code before: a relaunch of the whole job, attempts == 2)."""
    out, killed_at = tmp_path, []
    runner = sparkdist.HorovodRunner(np=4, min_np=2, max_np=4, ranks_per_task=2)
    with caplog.at_level("WARNING", logger="sparkdist"):
        result = run_beside(
            lambda: killed_at.append(kill_three(out)), runner, out, train_through_faults, 30
        )

    job = runner.last_job
    survivor = steps(out, 0, 0)
    before = [s for s in survivor if s["generation"] == 0]
    after = [s for s in survivor if s["generation"] > 0]
    next_step = after[0] if after else steps(out, 1, 0)[0]
    print(
        f"from the kill to the survivor's next step: {next_step['time'] - killed_at[0]:.1f} s "
        f"(attempts {job.attempts}, reformed {job.reformed}, failures {job.failures})"
    )
    assert job.attempts == 1 and job.failures == [], (job.attempts, job.failures)
    assert {s["pid"] for s in survivor} == {int((out / "pid-0-0").read_text())}
    assert after and after[0]["size"] == 3 and after[-1]["step"] == STEPS
    # From the last commit: no step skipped, at most the one in flight redone.
    assert before[-1]["step"] <= after[0]["step"] <= before[-1]["step"] + 1, (before, after)
    newcomers = sorted(int(p.name.split("-")[2]) for p in out.glob("pid-0-*"))[4:]
    assert newcomers == [4, 5], newcomers
    assert result == {"rank": 0, "step": STEPS, "size": 3}
    assert any(r.startswith("waited: ") for r in job.reformed), job.reformed
    log = "\n".join(r.getMessage() for r in caplog.records)
    assert "-> 1 ranks in process, below min_np=2: the survivors wait up to" in log, log
    assert "ranks [4, 5] joined, after" in log and "s below min_np" in log, log
    trace = json.loads(Path(job.trace).read_text())
    validate.check(trace)
    changes = [e["args"] for e in trace["traceEvents"] if e["name"] == "world change"]
    assert any(c["ranks"] == 1 and "below min_np=2" in c["why"] for c in changes), changes
    assert changes[-1]["ranks"] == 3 and "joined" in changes[-1]["why"], changes
    assert still_alive(runner) == []


class SlotTaker:
    """Another Spark job of one task, queued while the elastic job holds every slot, so
    that it gets the first slot to come free (FIFO: it was submitted first) and holds it
    while process `pid` lives (the first attempt's survivor): no slot comes back."""

    GROUP = "below-min-np-slot-taker"

    def __init__(self, sc, tmp_path: Path, pid: int):
        self.took = tmp_path / "slot-taken"
        took = str(self.took)

        def hold(rows):
            Path(took).touch()
            while pid_alive(pid):
                time.sleep(0.05)
            yield from rows

        def run() -> None:
            sc.setJobGroup(self.GROUP, "takes a slot for a test", True)
            sc.parallelize(range(1), 1).mapPartitions(hold).collect()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        tracker = sc.statusTracker()
        wait_for(lambda: tracker.getJobIdsForGroup(self.GROUP), "the slot taker queued")


def test_below_min_np_with_no_slot_back_in_time_relaunches(sc, tmp_path, caplog):
    """No slot comes back within start_timeout: the job relaunches from the start (no
    checkpoint here) as before; a stall_timeout shorter than the wait fails nothing."""
    out, killed_at, takers = tmp_path, [], []

    def take_a_slot_then_kill() -> None:
        wait_for(lambda: (out / "pid-0-0").exists(), "rank 0 started", 180)
        takers.append(SlotTaker(sc, tmp_path, int((out / "pid-0-0").read_text())))
        killed_at.append(kill_three(out))

    # The wait (start_timeout) is most of the test. It also bounds each rank's start to
    # its first sign of life: the relaunch's first step came 14-24 s after the wait at load
    # 11-12, so not below 30 s; the stall_timeout well inside the wait.
    runner = sparkdist.HorovodRunner(
        np=4, min_np=2, max_np=4, ranks_per_task=2, start_timeout=30, stall_timeout=10
    )
    with caplog.at_level("WARNING", logger="sparkdist"):
        result = run_beside(take_a_slot_then_kill, runner, out, train_through_faults, 30)

    job = runner.last_job
    relaunched = steps(out, 1, 0)
    took = relaunched[0]["time"] - killed_at[0]
    print(f"from the kill to the relaunch's first step: {took:.1f} s (a 30 s wait first)")
    assert takers[0].took.exists()  # it held the slot the world waited for
    assert result["rank"] == 0 and result["step"] == STEPS, result
    assert job.attempts == 2 and len(job.failures) == 1 and "SIGKILL" in job.failures[0]
    assert any(r.startswith("waited: ") for r in job.reformed), job.reformed
    log = "\n".join(r.getMessage() for r in caplog.records)
    assert "the wait below min_np=2 ends after" in log, log
    assert "silent for" not in log and "stalled" not in log, log
    takers[0].thread.join(timeout=60)
    assert still_alive(runner) == []


def test_driver_holds_a_world_below_min_np_until_newcomers_enter():
    """The protocol on a real `DriverService`, without Spark: four ranks, min_np=3. Two
    lost: the survivors' requests wait (a sign of life each); a third lost during the
    wait: it goes on with one; a decommission notice cannot take the last; the world forms
    once both newcomers entered, [survivor, newcomers]. Then a wait that runs out is
    refused with its losses, and its count is given back to the relaunch's."""
    from driver_peers import elastic_driver, reply, send

    from sparkdist.protocol import messages
    from sparkdist.runner.driver.failures import RelaunchBudget

    with elastic_driver(4, min_np=3) as peers:
        state, ranks = peers.state, peers.ranks
        membership, budget = state.membership, RelaunchBudget(3, False)
        for rank in (2, 3):
            state.losses.rank_exited(rank, -signal.SIGKILL, [])
        assert not membership.can_shrink() and membership.can_wait() and budget.reform()
        membership.hold(60.0)  # as the loop of attempts decides
        assert membership.survivors() == [0, 1] and membership.size() == 2
        assert membership.generation.number == 0 and state.failures.stopping is None
        seen = state.life.by_rank.get(0, 0.0)
        assert isinstance(ranks[0].request(messages.ElasticWorld(0, 0, 0.3)), messages.Missing)
        assert state.life.by_rank[0] > seen  # waiting for slots is a sign of life
        state.losses.rank_exited(1, -signal.SIGKILL, [])  # lost during the wait
        assert membership.can_wait() and budget.reform()
        membership.hold(60.0)
        assert membership.survivors() == [0] and membership.wait.counted == 2
        assert not membership.depart([0], "executor 0 is being decommissioned")
        send(ranks[0], messages.ElasticWorld(0, 0, 30.0))
        state.add_ranks([4, 5], "2 more rank slot(s) free below min_np")
        newcomers = {rank: peers.client(rank) for rank in (4, 5)}
        send(newcomers[4], messages.ElasticWorld(4, -1, 30.0))
        wait_for(lambda: 4 in membership.entered, "rank 4 entered", 10)
        assert membership.generation.number == 0  # 1 + 1 < min_np: no world yet
        formed = newcomers[5].request(messages.ElasticWorld(5, -1, 5.0))
        assert formed.value.number == 1 and formed.value.members == (0, 4, 5)
        assert "after" in formed.value.reason and "below min_np" in formed.value.reason
        for client in (ranks[0], newcomers[4]):
            assert reply(client) == formed
        assert membership.wait is None and membership.waited_out() is None
        # Rank 4 is lost: below min_np again, and no slot comes back in a (nil) limit.
        state.losses.rank_exited(4, -signal.SIGKILL, [])
        assert membership.can_wait() and budget.reform()
        membership.hold(0.0)
        assert "stayed below min_np=3 (2 ranks)" in (membership.waited_out() or "")
        assert not membership.can_wait()
        losses, counted = membership.refuse()
        assert [loss.rank for loss in losses] == [4] and counted == 1
        assert membership.min_np is None
        budget.returned(counted)
        assert budget.used == 2  # the first wait's two faults; the relaunch counts this one
