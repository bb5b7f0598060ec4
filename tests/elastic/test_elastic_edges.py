"""In-process elastic worlds' edges (issue 64), on real Spark (local-cluster, the
session's two executors, one slot each) with real ranks and torch's gloo:

* a newcomer seated at the very end of a warm world's run: the world (one task of two
  ranks) runs, a slot holder keeps the other slot; once the survivors returned from
  `elastic.run`, the slot is freed, the world seats a task of two newcomers, which take
  the run's order and ask for a world; the survivors hold their run's end until both
  newcomers took it. The run ends with the survivors' results (the newcomers leave it),
  and the next run trains in the grown world of four. Before, the newcomers formed a
  world with the survivors that had returned, and waited in it until the time limit.
* members that return just as a grow forms (after their last commit) run their
  function again in the grown world, with the newcomers.
"""

from __future__ import annotations

import threading
from pathlib import Path

from helpers import SlotHolder, wait_for

from sparkdist import HorovodRunner

ENV = {"SPARKDIST_ELASTIC_TIMEOUT_S": "20"}


def train_to_the_end(out: str, steps: int, world: int, hold: bool) -> dict:
    """Committed all_reduce steps in `elastic.run` until `steps` and a world of `world`
    ranks; with `hold`, launch ranks 0 and 1 mark that they returned from it, then wait
    (up to 120 s) until launch ranks 2 and 3 took the run, before it ends."""
    import os
    import time
    from pathlib import Path

    import torch
    import torch.distributed as dist

    from sparkdist import elastic

    launch = int(os.environ["RANK"])
    Path(out, f"took-{launch}").touch()

    @elastic.run
    def train(state):
        deadline = time.monotonic() + 120
        while state.step < steps or dist.get_world_size() < world:
            assert time.monotonic() < deadline, "the world never grew"
            value = torch.ones(1)
            dist.all_reduce(value)
            state.step += 1
            state.commit()
        return state.step, dist.get_world_size(), dist.get_rank()

    result = train(elastic.ObjectState(step=0))
    if hold and launch in (0, 1):
        Path(out, f"returned-{launch}").touch()
        deadline = time.monotonic() + 120
        while not all(Path(out, f"took-{r}").exists() for r in (2, 3)):
            assert time.monotonic() < deadline, "the newcomers never took the run"
            time.sleep(0.05)
    return {"launch": launch, "pid": os.getpid(), "result": result}


def took(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("took-*"))


def test_a_newcomer_seated_at_the_end_of_a_warm_run_trains_in_the_next(sc, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    holder = SlotHolder(sc, tmp_path, slots=1)

    def free_when_returned() -> None:
        wait_for(lambda: (first / "returned-0").exists(), "the survivors' return", 300)
        holder.release()

    threading.Thread(target=free_when_returned, daemon=True).start()
    options = dict(np=2, min_np=2, max_np=4, ranks_per_task=2, keep_warm=120, env=ENV)
    with HorovodRunner(**options, start_timeout=180, timeout=240) as runner:
        ended = runner.run_all(train_to_the_end, out=str(first), steps=3, world=2, hold=True)
        grown = runner.run_all(train_to_the_end, out=str(second), steps=2, world=4, hold=False)
    assert [r["launch"] for r in ended] == [0, 1], ended
    assert [r["result"] for r in ended] == [(3, 2, 0), (3, 2, 1)], ended
    assert took(first) == took(second) == [f"took-{r}" for r in range(4)]
    assert [r["launch"] for r in grown] == [0, 1, 2, 3], grown
    assert [r["result"][1:] for r in grown] == [(4, r) for r in range(4)], grown
    assert [r["pid"] for r in grown[:2]] == [r["pid"] for r in ended]  # kept warm


def grown_as_it_returns(out: str, steps: int) -> dict:
    """`steps` committed steps; after the last commit, launch ranks 0 and 1 mark it and
    wait inside the function until the driver formed a grown world, then return: the
    grow came after their last commit, as they returned."""
    import os
    from pathlib import Path

    import torch
    import torch.distributed as dist

    from sparkdist import elastic
    from sparkdist.protocol import messages
    from sparkdist.protocol.driver_channel import driver_client

    launch = int(os.environ["RANK"])
    calls = []

    @elastic.run
    def train(state):
        calls.append(dist.get_world_size())
        while state.step < steps:
            dist.all_reduce(torch.ones(1))
            state.step += 1
            state.commit()
        if launch < 2 and len(calls) == 1:
            Path(out, f"committed-{launch}").touch()
            reply = driver_client().request(messages.ElasticWorld(launch, 0, 120.0))
            assert isinstance(reply, messages.Ok), reply
        dist.all_reduce(torch.ones(1))  # in whichever world it returns from
        return state.step, dist.get_world_size()

    return {"launch": launch, "result": train(elastic.ObjectState(step=0)), "calls": calls}


def test_members_that_return_as_a_grow_forms_run_again_with_the_newcomers(sc, tmp_path):
    """A cold in-process job: the slot frees after the members' last commit, and the grown
    world forms while they are returning. They run their function again in it, from the
    last commit (nothing to redo), with the newcomers; all four return. Before, the
    members returned as a world of 2 and the newcomers waited in the grown world until
    the job's time limit."""
    holder = SlotHolder(sc, tmp_path, slots=1)

    def free_when_committed() -> None:
        wait_for(lambda: (tmp_path / "committed-0").exists(), "the last commit", 300)
        holder.release()

    threading.Thread(target=free_when_committed, daemon=True).start()
    options = dict(np=2, min_np=2, max_np=4, ranks_per_task=2, env=ENV)
    runner = HorovodRunner(**options, start_timeout=180, timeout=200)
    results = runner.run_all(grown_as_it_returns, out=str(tmp_path), steps=3)
    assert [r["launch"] for r in results] == [0, 1, 2, 3], results
    assert [r["result"] for r in results] == [(3, 4)] * 4, results
    assert [r["calls"] for r in results[:2]] == [[2, 4], [2, 4]], results
    assert [r["calls"] for r in results[2:]] == [[4], [4]], results
