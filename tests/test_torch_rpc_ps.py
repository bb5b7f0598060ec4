"""`sparkdist.torch_rpc` on the runner's ranks: RPC names and options come from
the environment, and PyTorch's RPC parameter server (tests/scripts/rpc_parameter_server.py)
trains through it: one server, trainers that run forward on it through an RRef, backward
with distributed autograd and step with `DistributedOptimizer`.

The Spark session has two one-core executors: 3 ranks (1 server + 2 trainers) cannot be
split into equal tasks there (np must be a multiple of ranks_per_task), so the cluster
runs 4 ranks (ranks_per_task=2: 1 server + 3 trainers), and the driver (np=-3) runs the
1 server + 2 trainers layout.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from sparkdist import HorovodRunner

pytest.importorskip("sklearn")

SCRIPTS = str(Path(__file__).parent / "scripts")
EPOCHS = 10
TRAIN_ROWS = 1437  # 80% of the 1797 digits


def parameter_server_main(epochs: int) -> dict:
    """On a rank: import the script (RPC pickles its classes by reference, so every
    rank needs it importable) and run it."""
    if SCRIPTS not in sys.path:
        sys.path.insert(0, SCRIPTS)
    from rpc_parameter_server import train

    return train(epochs=epochs)


def expected_steps(world_size: int) -> dict[int, int]:
    """Each trainer's steps: its strided shard of the training rows, in batches of 32."""
    trainers = world_size - 1
    shard = {r: len(range(r - 1, TRAIN_ROWS, trainers)) for r in range(1, world_size)}
    return {r: EPOCHS * math.ceil(rows / 32) for r, rows in shard.items()}


def check_parameter_server(views: list[dict], world_size: int) -> None:
    server = views[0]
    assert server["world_size"] == world_size
    assert server["accuracy"] >= 0.9, server
    steps = expected_steps(world_size)
    assert server["steps"] == steps
    assert server["updates"] == sum(steps.values())  # one server update per trainer step
    assert [v["name"] for v in views] == [f"worker{r}" for r in range(world_size)]
    assert [v.get("steps") for v in views[1:]] == list(steps.values())


def test_parameter_server_with_three_trainers_on_the_cluster(sc):
    views = HorovodRunner(np=4, ranks_per_task=2, timeout=120).run_all(
        parameter_server_main, epochs=EPOCHS
    )
    check_parameter_server(views, 4)


def test_parameter_server_with_two_trainers_on_the_driver():
    views = HorovodRunner(np=-3, timeout=120).run_all(parameter_server_main, epochs=EPOCHS)
    check_parameter_server(views, 3)


def names_main() -> dict:
    """Two RPC sessions: default names, then chosen ones; what each rank saw."""
    import os

    import torch.distributed as dist
    from torch.distributed import rpc

    from sparkdist import torch_rpc

    rank = int(os.environ["RANK"])
    options = torch_rpc.rpc_options(rpc_timeout=30, num_worker_threads=4)
    with torch_rpc.rpc_session(rpc_timeout=30, num_worker_threads=4) as name:
        # RemoteModule's generated module exists before any RPC can arrive.
        generated = "_remote_module_non_scriptable" in sys.modules
        peer = torch_rpc.worker_name(1 - rank)
        peer_rank = rpc.rpc_sync(peer, os.getenv, args=("RANK",))
        names = sorted(info.name for info in rpc.api._get_current_rpc_agent().get_worker_infos())
    left = None
    if rank == 0:  # shutdown returned once both ranks had marked rank 0's store
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
        left = store.check([torch_rpc.LEFT_KEY.format(session=1, rank=r) for r in (0, 1)])
    with torch_rpc.rpc_session(f"trainer{rank}") as chosen:
        chosen_peer = rpc.rpc_sync(f"trainer{1 - rank}", os.getenv, args=("RANK",))
    return {
        "name": name,
        "names": names,
        "peer_rank": peer_rank,
        "chosen": chosen,
        "chosen_peer": chosen_peer,
        "generated": generated,
        "init_method": options.init_method,
        "rpc_timeout": options.rpc_timeout,
        "num_worker_threads": options.num_worker_threads,
        "left": left,
    }


def test_names_and_options_come_from_the_environment(sc):
    views = HorovodRunner(np=2, timeout=90).run_all(names_main)
    assert [v["name"] for v in views] == ["worker0", "worker1"]
    assert [v["names"] for v in views] == [["worker0", "worker1"]] * 2
    assert [v["peer_rank"] for v in views] == ["1", "0"]
    assert [v["chosen"] for v in views] == ["trainer0", "trainer1"]
    assert [v["chosen_peer"] for v in views] == ["1", "0"]
    for view in views:
        assert view["generated"]
        assert view["init_method"] == "env://"
        assert (view["rpc_timeout"], view["num_worker_threads"]) == (30, 4)
    assert views[0]["left"] is True


def test_outside_a_rank_the_helper_says_what_is_missing(monkeypatch):
    from sparkdist import torch_rpc

    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(RuntimeError, match="MASTER_ADDR and MASTER_PORT are not set"):
        torch_rpc.rpc_options()
    with pytest.raises(RuntimeError, match="without torch_rpc.init_rpc"):
        torch_rpc.shutdown()
