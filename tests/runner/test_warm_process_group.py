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


def test_the_kept_group_serves_scripts_that_form_and_destroy_it(sc):
    with HorovodRunner(np=2, launcher="direct", keep_warm=120, start_timeout=120) as runner:
        first = runner.run_all(script)
        second = runner.run_all(script)
        found = runner.run_all(uses_the_group, subgroup=True)
        again = runner.run_all(uses_the_group)
    assert [r["sum"] for r in first + second] == [3.0] * 4
    assert [r["pid"] for r in second] == [r["pid"] for r in first]
    assert [r["up_at_start"] for r in first + second] == [False, False, True, True]
    # The script's destroy left the group up, and the next run's init found it.
    assert [r["up_at_end"] for r in first + second] == [True] * 4
    assert [r["group"] for r in second] == [r["group"] for r in first]
    assert all(r["init_s"] < 0.05 for r in second), second
    # Code that only uses the group finds it; its subgroup is ended with its run.
    assert [f[:2] for f in found] == [(r["group"], 2.0) for r in first]
    assert [a[:2] for a in again] == [(r["group"], 2.0) for r in first]
    assert [f[2] for f in found] == [2, 2] and [a[2] for a in again] == [1, 1]


def test_a_group_one_rank_lost_is_formed_anew_on_every_rank(sc):
    """Rank 1 ends its group past the wrapper (as a run that aborts a communicator): the
    next run's ranks agree it is gone, drop it everywhere, and form a new one."""
    with HorovodRunner(np=2, launcher="direct", keep_warm=120, start_timeout=120) as runner:
        first = runner.run_all(script, destroy_by_hand_on=1)
        second = runner.run_all(script)
        third = runner.run_all(script)
    assert [r["sum"] for r in first + second + third] == [3.0] * 6
    assert [r["pid"] for r in third] == [r["pid"] for r in first]
    assert [r["up_at_end"] for r in first] == [True, False]
    assert [r["up_at_start"] for r in second] == [False, False]  # dropped on both ranks
    assert [r["up_at_start"] for r in third] == [True, True]  # the new one kept
    assert [r["group"] for r in third] == [r["group"] for r in second]


@pytest.mark.timeout(240)
def test_a_collective_left_unmatched_fails_the_next_run_and_a_new_world_follows(sc):
    """A run leaves an allreduce queued on one rank only: the next run's barrier on the
    kept group cannot pass, so that run fails (the group's 5 s timeout, not a hang), its
    world ends, and the run after it gets a new world whose group works."""
    with HorovodRunner(np=2, launcher="direct", keep_warm=120, start_timeout=120) as runner:
        first = runner.run_all(script, leave_unmatched_on=1, timeout_s=5)
        with pytest.raises(RankFailedError, match="did not pass a barrier"):
            runner.run_all(script)
        after = runner.run_all(script)
    assert [r["sum"] for r in first + after] == [3.0] * 4
    assert {r["pid"] for r in after}.isdisjoint(r["pid"] for r in first)
    assert [r["up_at_start"] for r in after] == [False, False]


def fails_on_rank_1():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise ValueError("this run fails")
    dist.barrier()


def test_a_failed_run_ends_the_kept_group_with_its_world(sc):
    with HorovodRunner(np=2, launcher="direct", keep_warm=120, start_timeout=120) as runner:
        first = runner.run_all(script)
        with pytest.raises(RankFailedError, match="this run fails"):
            runner.run_all(fails_on_rank_1)
        after = runner.run_all(script)
    assert {r["pid"] for r in after}.isdisjoint(r["pid"] for r in first)
    assert [(r["up_at_start"], r["sum"]) for r in after] == [(False, 3.0)] * 2
