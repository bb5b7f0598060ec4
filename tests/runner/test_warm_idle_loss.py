"""A host lost while a warm world is idle (issue 64), on real Spark (local-cluster, the
session's two executors) with real ranks: task 1's Python worker is SIGKILLed between
runs (as a lost executor's), its ranks with it.

* a fixed-size world ends once the driver sees the loss, and the next run starts a new
  one; a run that comes before the driver saw it fails naming the loss, or runs anew;
* an elastic world relaunches, and the next run finds its new ranks, kept warm after;
* an in-process elastic world re-forms without the lost task's ranks, and the next run
  trains in the survivors' processes.
"""

from __future__ import annotations

import os
import signal

import psutil
from helpers import pid_alive, wait_for

from sparkdist import HorovodRunner, RankFailedError
from sparkdist.runner.driver import warm


def where(_x: int = 0) -> dict:
    """This rank's pid and its task's Python worker's (its supervisor's parent)."""
    import os

    import psutil

    supervisor = psutil.Process(os.getppid())
    return {"pid": os.getpid(), "worker": supervisor.ppid(), "rank": int(os.environ["RANK"])}


def _lose_task_1(first: list[dict]) -> None:
    """SIGKILL task 1's Python worker (that of `first[1]`'s rank), as a lost executor's:
    its ranks go with it."""
    worker = first[1]["worker"]
    assert "python" in " ".join(psutil.Process(worker).cmdline())
    os.kill(worker, signal.SIGKILL)
    wait_for(lambda: not pid_alive(first[1]["pid"]), "rank 1 to go with its task", 30)


def test_a_fixed_world_that_lost_a_host_while_idle_is_replaced_at_the_next_run(sc):
    """The world ends when the driver sees the loss; the next run starts a new one."""
    with HorovodRunner(np=2, launcher="direct", keep_warm=120, start_timeout=120) as runner:
        first = runner.run_all(where)
        world = warm.current()
        _lose_task_1(first)
        wait_for(lambda: not world.usable, "the world to end of its loss", 60)
        second = runner.run_all(where)
    assert {r["pid"] for r in second}.isdisjoint(r["pid"] for r in first)
    assert [r["rank"] for r in second] == [0, 1]
    wait_for(lambda: not pid_alive(first[0]["pid"]), "the old world's rank 0 to end", 30)


def test_an_elastic_world_that_lost_a_host_while_idle_relaunches_for_the_next_run(sc):
    """An elastic world (min_np/max_np) relaunches as it would mid-run; the next run
    finds the relaunched ranks, as warm as any."""
    options = dict(np=2, min_np=1, max_np=2, launcher="direct", keep_warm=120)
    with HorovodRunner(**options, start_timeout=120) as runner:
        first = runner.run_all(where)
        world = warm.current()
        _lose_task_1(first)
        wait_for(lambda: world.dispatch.attempt == 1, "the world to relaunch", 120)
        second = runner.run_all(where)
        third = runner.run_all(where)
        assert warm.current() is world
    assert [r["rank"] for r in second] == [0, 1]
    assert {r["pid"] for r in second}.isdisjoint(r["pid"] for r in first)
    assert [r["pid"] for r in third] == [r["pid"] for r in second]  # kept warm


def elastic_where(steps: int) -> dict:
    """In-process elastic code: `steps` committed steps; the rank's pid, its task's Python
    worker's and the world's size."""
    import os

    import psutil
    import torch
    import torch.distributed as dist

    from sparkdist import elastic

    @elastic.run
    def train(state):
        while state.step < steps:
            dist.all_reduce(torch.ones(1))
            state.step += 1
            state.commit()
        return dist.get_world_size()

    size = train(elastic.ObjectState(step=0))
    worker = psutil.Process(os.getppid()).ppid()
    return {"pid": os.getpid(), "worker": worker, "rank": int(os.environ["RANK"]), "size": size}


def test_an_in_process_world_that_lost_a_host_while_idle_goes_on_without_it(sc):
    """In-process elastic code on an elastic world of two tasks of two ranks: task 1 lost
    between runs, the world re-forms without its ranks, and the next run trains as 2 in
    the survivors' processes."""
    options = dict(np=4, min_np=2, max_np=4, ranks_per_task=2, keep_warm=120)
    with HorovodRunner(**options, start_timeout=120) as runner:
        first = runner.run_all(elastic_where, steps=2)
        world = warm.current()
        _lose_task_1([first[0], first[2]])  # launch rank 2: task 1's first
        members = lambda: world.dispatch.state.membership.generation.members  # noqa: E731
        wait_for(lambda: members() == (0, 1), "the world to go on without task 1", 60)
        second = runner.run_all(elastic_where, steps=2)
    assert [r["size"] for r in first] == [4] * 4
    assert [(r["rank"], r["size"]) for r in second] == [(0, 2), (1, 2)]
    assert [r["pid"] for r in second] == [r["pid"] for r in first[:2]]


def test_a_run_right_after_an_idle_world_lost_a_host_fails_clearly_or_runs_anew(sc):
    """The next run starts before the driver saw the loss (no wait for it): it runs on a
    new world, or it fails naming the loss, and the run after it runs on a new world."""
    with HorovodRunner(np=2, launcher="direct", keep_warm=120, start_timeout=120) as runner:
        first = runner.run_all(where)
        _lose_task_1(first)
        try:
            second = runner.run_all(where)
        except RankFailedError as exc:
            assert "lost contact" in str(exc), str(exc)
            second = runner.run_all(where)
    assert [r["rank"] for r in second] == [0, 1]
    assert {r["pid"] for r in second}.isdisjoint(r["pid"] for r in first)
