"""Elastic jobs (`min_np`/`max_np`) on real Spark (local-cluster, two one-core executors):
bad input refused before any Spark job, a job that starts with the one slot free and
grows when the other frees, a job below min_np that fails clearly and leaves nothing,
a rank killed and the world relaunched from its checkpoint, and the fronts (the
TorchDistributor keyword, the command's flags). Executors lost and dynamic allocation
are in tests/cluster/test_elastic_cluster.py (a standalone cluster that really shrinks)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from helpers import SlotHolder, refused_by_sparkdist_run, still_alive

import sparkdist
from sparkdist import checkpoint
from sparkdist.errors import NotEnoughSlotsError


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"np": 2, "min_np": 0}, "min_np must be at least 1"),
        ({"np": 2, "min_np": 3, "max_np": 2}, "min_np=3 is more than max_np=2"),
        ({"np": 4, "min_np": 1, "max_np": 3}, "np=4 must lie between min_np=1 and max_np=3"),
        ({"np": -2, "min_np": 1}, "runs every rank on the driver"),
        ({"np": 4, "min_np": 1, "ranks_per_task": 2}, "multiples of ranks_per_task=2"),
        ({"np": 2, "max_np": 2.5}, "max_np must be an int"),
        (
            {"np": 4, "max_np": 4, "roles": {"chief": 1, "worker": 2, "ps": 1}},
            "cannot be combined with min_np/max_np",
        ),
    ],
)
def test_bad_elastic_options_are_refused_at_once(options, message):
    with pytest.raises(ValueError) as err:
        sparkdist.HorovodRunner(**options)
    assert message in str(err.value)


def test_max_np_beyond_a_fixed_cluster_is_refused_before_any_spark_job(sc):
    jobs_before = len(sc.statusTracker().getJobIdsForGroup(None))
    runner = sparkdist.HorovodRunner(np=2, min_np=1, max_np=3)
    with pytest.raises(NotEnoughSlotsError) as err:
        runner.run(lambda: 1)
    assert "max_np=3 ranks need 3 task slots" in str(err.value)
    assert "has 2 task slots" in str(err.value)
    assert len(sc.statusTracker().getJobIdsForGroup(None)) == jobs_before


def counting_main(progress: str, release: str, max_np: int, after_growth: int = 3) -> dict:
    """Count steps with an allreduce, a checkpoint after each; rank 0 records each saved
    step with the world that did it. At step 3 of the first world it frees a slot
    (`release`); a world smaller than max_np keeps stepping until the job grows (rank 0's
    save then stops it), and the full world stops `after_growth` steps in."""
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    found = checkpoint.resume()
    step, total = (found.step, found.state["total"]) if found else (0, 0.0)
    first = step
    resumed_from_world = found.world_size if found else None
    deadline = time.monotonic() + 180
    while True:
        ones = torch.ones(1)
        dist.all_reduce(ones)
        total += float(ones)
        step += 1
        time.sleep(0.05)  # the step's work
        if rank == 0:
            record = {
                "step": step,
                "world": world,
                "attempt": checkpoint.attempt(),
                "resumed_from_world": resumed_from_world,
            }
            try:
                checkpoint.save({"total": total}, step)
            finally:
                with open(progress, "a") as out:
                    out.write(json.dumps(record) + "\n")
            if step == 3 and not os.path.exists(release):
                Path(release).touch()
        if world == max_np and step - first >= after_growth:
            break
        assert time.monotonic() < deadline, "the job never grew"
    dist.destroy_process_group()
    return {"step": step, "total": total, "world": world}


def test_starts_with_the_free_slot_and_grows_when_another_frees(sc, tmp_path, caplog):
    holder = SlotHolder(sc, tmp_path, slots=1)
    progress, release = tmp_path / "progress.jsonl", tmp_path / "release"
    holder.release_when(release)
    runner = sparkdist.HorovodRunner(np=2, min_np=1, max_np=2)
    with caplog.at_level("WARNING", logger="sparkdist.runner.driver.elastic"):
        result = runner.run(counting_main, progress=str(progress), release=str(release), max_np=2)
    records = [json.loads(line) for line in progress.read_text().splitlines()]
    steps = [r["step"] for r in records]
    assert steps == list(range(1, len(steps) + 1)), steps  # every step once, in order
    worlds = [r["world"] for r in records]
    grew_at = worlds.index(2)
    assert set(worlds[:grew_at]) == {1} and set(worlds[grew_at:]) == {2}, worlds
    assert records[grew_at]["resumed_from_world"] == 1
    assert result["world"] == 2 and result["step"] == steps[-1]
    # Each step added one per rank of the world that did it.
    assert result["total"] == sum(worlds)
    assert runner.last_job.attempts == 2
    assert runner.last_job.failures[0].startswith("grew: 1 more rank slot(s) free")
    assert still_alive(runner) == []  # nothing of either world is left
    changes = [r.getMessage() for r in caplog.records if "world" in r.getMessage()]
    assert "world 0 -> 1 ranks: start" in changes[0]
    assert "world 1 -> 2 ranks: 1 more rank slot(s) free" in changes[1]
    assert f"resuming from step {steps[grew_at - 1]}" in changes[1]


def test_below_min_np_fails_clearly_and_leaves_nothing(sc, tmp_path):
    holder = SlotHolder(sc, tmp_path, slots=2)
    try:
        runner = sparkdist.HorovodRunner(np=2, min_np=1, max_np=2, start_timeout=3)
        with pytest.raises(NotEnoughSlotsError) as err:
            runner.run(lambda: 1)
        text = str(err.value)
        assert "only 0 of the 1 task slots that min_np=1 ranks need" in text
        assert "max_np=2" in text
        tag = f"sparkdist-{runner.last_job.job_id}"
        tracker = sc.statusTracker()
        running = [
            j
            for j in tracker.getJobIdsForGroup(tag)
            if tracker.getJobInfo(j) and tracker.getJobInfo(j).status == "RUNNING"
        ]
        assert running == []  # its waiting tasks were cancelled
    finally:
        holder.release()


def rank_killed_main(progress: str, killed: str) -> dict:
    """A few checkpointed steps; in the first attempt rank 1 dies of SIGKILL at step 2."""
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    found = checkpoint.resume()
    step = found.step if found else 0
    while step < 5:
        ones = torch.ones(1)
        dist.all_reduce(ones)
        step += 1
        if rank == 1 and step == 2 and not os.path.exists(killed):
            Path(killed).touch()
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.05)
        if rank == 0:
            checkpoint.save({}, step)
            with open(progress, "a") as out:
                out.write(json.dumps({"step": step, "world": world}) + "\n")
    dist.destroy_process_group()
    return {"world": world, "attempt": checkpoint.attempt()}


def test_killed_rank_relaunches_the_world_from_its_checkpoint(sc, tmp_path, caplog):
    progress = tmp_path / "progress.jsonl"
    runner = sparkdist.HorovodRunner(np=2, min_np=1, max_np=2, max_failures=1)
    with caplog.at_level("WARNING", logger="sparkdist.runner.driver.elastic"):
        result = runner.run(
            rank_killed_main, progress=str(progress), killed=str(tmp_path / "killed")
        )
    steps = [json.loads(line)["step"] for line in progress.read_text().splitlines()]
    assert sorted(set(steps)) == [1, 2, 3, 4, 5]
    assert result["attempt"] == 1
    assert len(runner.last_job.failures) == 1 and "SIGKILL" in runner.last_job.failures[0]
    relaunch = [r.getMessage() for r in caplog.records if "world 2 ->" in r.getMessage()]
    assert relaunch and "SIGKILL" in relaunch[0] and "relaunch 1 of at most 1" in relaunch[0]
    assert still_alive(runner) == []


def world_of_this_rank() -> dict:
    return {"rank": int(os.environ["RANK"]), "world": int(os.environ["WORLD_SIZE"])}


def test_torch_distributor_takes_the_elastic_keywords(sc):
    distributor = sparkdist.TorchDistributor(
        num_processes=2, local_mode=False, use_gpu=False, min_processes=1, max_processes=2
    )
    assert distributor.run(world_of_this_rank) == {"rank": 0, "world": 2}


def test_sparkdist_run_takes_the_elastic_flags(tmp_path):
    """`sparkdist run --min-np/--max-np` checks them like the runner, before Spark."""
    stderr = refused_by_sparkdist_run(tmp_path, "--np", "3", "--min-np", "1", "--max-np", "2")
    assert "np=3 must lie between min_np=1 and max_np=2" in stderr


def frameworks_main(progress: str, release: str) -> dict:
    """What Horovod, MPI, TensorFlow's TF_CONFIG and torch's variables say the world is;
    a world smaller than 2 frees a slot and checkpoints until the job grows."""
    import time

    import horovod.torch as hvd
    from mpi4py import MPI

    hvd.init()
    sizes = {
        "WORLD_SIZE": int(os.environ["WORLD_SIZE"]),
        "horovod": hvd.size(),
        "mpi": MPI.COMM_WORLD.Get_size(),
        "tf_config": len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"]),
    }
    with open(progress, "a") as out:
        out.write(json.dumps(sizes) + "\n")
    if hvd.size() == 2:
        return sizes
    Path(release).touch()
    step, deadline = 0, time.monotonic() + 120
    while time.monotonic() < deadline:
        step += 1
        checkpoint.save({}, step)  # raises checkpoint.Resize once the job grows
        time.sleep(0.1)
    raise AssertionError("the job never grew")


@pytest.mark.horovod
def test_every_framework_sees_the_world_after_it_grows(sc, tmp_path):
    holder = SlotHolder(sc, tmp_path, slots=1)
    progress, release = tmp_path / "sizes.jsonl", tmp_path / "release"
    holder.release_when(release)
    runner = sparkdist.HorovodRunner(np=1, min_np=1, max_np=2, launcher="mpi")
    result = runner.run(frameworks_main, progress=str(progress), release=str(release))
    seen = [json.loads(line) for line in progress.read_text().splitlines()]
    one = {"WORLD_SIZE": 1, "horovod": 1, "mpi": 1, "tf_config": 1}
    two = {"WORLD_SIZE": 2, "horovod": 2, "mpi": 2, "tf_config": 2}
    assert seen == [one, two, two] and result == two
    assert runner.last_job.attempts == 2
