"""A warm world keeps its torch process group and its store from run to run (issue 61):
real Spark (local-cluster), real ranks, real torch.distributed over Gloo."""

from __future__ import annotations

import pytest

from sparkdist import HorovodRunner, RankFailedError


def script(destroy_by_hand_on=None, leave_unmatched_on=None, timeout_s=None):
    """A training script's pattern: `init_process_group` first, `destroy_process_group`
    last. Returns the rank's pid, whether the group was up before `main` formed one, the
    group's identity, how long `init_process_group` took and an allreduce's sum.

    `destroy_by_hand_on`: that rank ends its group past sparkdist's wrapper (torch's own
    `distributed_c10d.destroy_process_group`), as a run that aborts its communicator does.
    `leave_unmatched_on`: that rank leaves an allreduce queued that no peer matches."""
    import datetime
    import os
    import time

    import torch
    import torch.distributed as dist

    up_at_start = dist.is_initialized()
    began = time.perf_counter()
    timeout = datetime.timedelta(seconds=timeout_s) if timeout_s else None
    dist.init_process_group("gloo", timeout=timeout)
    init_s = time.perf_counter() - began
    rank = dist.get_rank()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    group = id(dist.group.WORLD)
    if rank == leave_unmatched_on:
        dist.all_reduce(torch.ones(1), async_op=True)
    if rank == destroy_by_hand_on:
        dist.distributed_c10d.destroy_process_group()
    else:
        dist.destroy_process_group()
    return {
        "pid": os.getpid(),
        "up_at_start": up_at_start,
        "group": group,
        "init_s": init_s,
        "sum": value.item(),
        "up_at_end": dist.is_initialized(),
    }


def uses_the_group(subgroup=False):
    """Code that finds the group up (`is_initialized`) and does not form one; with
    `subgroup`, it also makes a subgroup, which the world ends after the run."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return None
    value = torch.tensor([1.0])
    dist.all_reduce(value, group=dist.new_group([0, 1]) if subgroup else None)
    return id(dist.group.WORLD), value.item(), len(dist.distributed_c10d._world.pg_map)


def test_the_kept_group_serves_every_run_and_is_formed_anew_when_a_rank_lost_it(sc):
    """Scripts that form the group and destroy it, and code that only uses it, all run on
    the group run 1 formed. Then rank 1 ends its group past the wrapper (as a run that
    aborts its communicator does): the next run's ranks agree it is gone, drop it on every
    rank and form a new one, which the run after keeps."""
    with HorovodRunner(np=2, launcher="direct", keep_warm=120, start_timeout=120) as runner:
        first = runner.run_all(script)
        second = runner.run_all(script)
        found = runner.run_all(uses_the_group, subgroup=True)
        again = runner.run_all(uses_the_group)
        lost = runner.run_all(script, destroy_by_hand_on=1)
        formed = runner.run_all(script)
        kept = runner.run_all(script)
    assert [r["sum"] for r in first + second + lost + formed + kept] == [3.0] * 10
    assert {r["pid"] for r in kept} == {r["pid"] for r in first}
    assert [r["up_at_start"] for r in first + second] == [False, False, True, True]
    # The script's destroy left the group up, and the next run's init found it.
    assert [r["up_at_end"] for r in first + second] == [True] * 4
    assert [r["group"] for r in second] == [r["group"] for r in first]
    # Code that only uses the group finds it; its subgroup is ended with its run.
    assert [f[:2] for f in found] == [(r["group"], 2.0) for r in first]
    assert [a[:2] for a in again] == [(r["group"], 2.0) for r in first]
    assert [f[2] for f in found] == [2, 2] and [a[2] for a in again] == [1, 1]
    # Lost on rank 1 only: dropped on both ranks, formed anew, then kept again.
    assert [r["up_at_end"] for r in lost] == [True, False]
    assert [r["up_at_start"] for r in formed] == [False, False]
    assert [r["up_at_start"] for r in kept] == [True, True]
    assert [r["group"] for r in kept] == [r["group"] for r in formed]


@pytest.mark.timeout(240)
def test_a_collective_left_unmatched_fails_the_next_run_and_a_new_world_follows(sc):
    """A run leaves an allreduce queued on one rank only: the next run's barrier on the
    kept group cannot pass, so that run fails (the group's 5 s timeout, not a hang), its
    world ends, ranks stuck in the barrier included, and the run after it gets a new world
    whose group works."""
    with HorovodRunner(np=2, launcher="direct", keep_warm=120, start_timeout=120) as runner:
        first = runner.run_all(script, leave_unmatched_on=1, timeout_s=5)
        with pytest.raises(RankFailedError, match="did not pass a barrier"):
            runner.run_all(script)
        after = runner.run_all(script)
    assert [r["sum"] for r in first + after] == [3.0] * 4
    assert {r["pid"] for r in after}.isdisjoint(r["pid"] for r in first)
    assert [r["up_at_start"] for r in after] == [False, False]
