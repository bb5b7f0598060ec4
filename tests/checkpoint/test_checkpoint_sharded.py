"""Sharded checkpoints (`sparkdist.checkpoint` over torch.distributed.checkpoint) with
real ranks on real Spark (local-cluster, two one-core executors), FSDP2 on CPU/gloo:

* a rank killed in the middle of a sharded save: the job resumes from the previous
  committed step, the half-written directory is never read and is removed by the next
  commit; then an async save during which training steps go on, committed only once
  every shard is down;
* a world of 3 resumes what 2 saved and a world of 2 what 3 saved, parameters and the
  data position identical;
* an elastic job that grows from 1 to 2 ranks right after a sharded save and resumes
  from it;
* a driver-path state over the limit refused on the rank before anything is sent;
* the driver's record: commits, retention, pins, partial directories (no Spark).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from helpers import SlotHolder, fsdp_model, still_alive, train_step

import sparkdist
from sparkdist import checkpoint
from sparkdist.checkpoint.driver.store import CheckpointStore

# --- what the ranks run -------------------------------------------------------------


def full_params(model) -> dict:
    """Every parameter, gathered whole (a collective: call it on every rank)."""
    return {k: v.full_tensor().clone() for k, v in model.state_dict().items()}


def state_of(model, opt, data: dict) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, opt)
    return {"model": model_state, "optim": optim_state, "data": data}


def resume_into(model, opt):
    """checkpoint.resume into this world's layout, applied to the model and optimizer."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    template = state_of(model, opt, {"epoch": 0, "offset": 0})
    found = checkpoint.resume(into=template)
    if found is not None:
        set_state_dict(
            model, opt, model_state_dict=template["model"], optim_state_dict=template["optim"]
        )
    return found, template["data"]


def save_reference(model, refs: str, step: int) -> None:
    import torch

    params = full_params(model)
    if int(os.environ["RANK"]) == 0:
        torch.save(params, os.path.join(refs, f"ref-{step}.pt"))


def same_as_reference(model, refs: str, step: int) -> bool:
    import torch

    saved = torch.load(os.path.join(refs, f"ref-{step}.pt"))
    now = full_params(model)
    return sorted(now) == sorted(saved) and all(torch.equal(now[k], saved[k]) for k in saved)


class KillWhenWritten:
    """A value whose pickling (by DCP, writing this rank's shard) kills the rank."""

    def __reduce__(self):
        os.kill(os.getpid(), signal.SIGKILL)


class Gate:
    """A value whose pickling (DCP's background write) waits until `path` exists: the
    async save stays in flight until the training loop opens the gate."""

    def __init__(self, path: str):
        self.path = path

    def __deepcopy__(self, memo):  # async staging copies the state: keep the gate
        return self

    def __reduce__(self):
        import time

        deadline = time.monotonic() + 120
        while not os.path.exists(self.path):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the gate {self.path} never opened")
            time.sleep(0.01)
        return (int, (0,))


def killed_then_async_main(refs: str) -> dict:
    """Attempt 0: save step 1, then rank 1 dies in the middle of saving step 2.
    Attempt 1: resume step 1; save step 2 asynchronously and train 3 more steps while
    it is in flight (held by a gate), recording what the driver has committed."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, opt = fsdp_model()
    found, data = resume_into(model, opt)
    if found is None:
        train_step(model, opt, 1)
        save_reference(model, refs, 1)
        checkpoint.save(state_of(model, opt, {"epoch": 1, "offset": 11}), 1)
        train_step(model, opt, 2)
        state = state_of(model, opt, {"epoch": 2, "offset": 22})
        if rank == 1:
            state["bomb"] = KillWhenWritten()
        checkpoint.save(state, 2)
        raise AssertionError("rank 1 should have died in the middle of saving step 2")
    result = {
        "resumed": found.step,
        "from_world": found.world_size,
        "data": data,
        "same": same_as_reference(model, refs, found.step),
    }
    train_step(model, opt, 2)
    save_reference(model, refs, 2)
    state = state_of(model, opt, {"epoch": 2, "offset": 22})
    state["gate"] = Gate(os.path.join(refs, "gate"))
    checkpoint.save(state, 2, async_save=True)
    events = [("saved async", 2, checkpoint.committed_steps())]
    for step in (3, 4, 5):
        train_step(model, opt, step)  # collectives of training beside the save's
        events.append(("trained", step, checkpoint.committed_steps()))
    Path(refs, "gate").touch()
    checkpoint.wait()
    events.append(("waited", 5, checkpoint.committed_steps()))
    dist.destroy_process_group()
    return {**result, "events": events, "rank": rank}


def reshard_main(refs: str, save_step: int, async_save: bool = False) -> dict:
    """Resume the newest checkpoint into this world, compare, train, save `save_step`
    (async: left in flight when `main` returns, which must wait for its commit)."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    model, opt = fsdp_model()
    found, data = resume_into(model, opt)
    result = {
        "resumed": found.step,
        "from_world": found.world_size,
        "data": data,
        "same": same_as_reference(model, refs, found.step),
        "world": dist.get_world_size(),
    }
    train_step(model, opt, save_step)
    save_reference(model, refs, save_step)
    state = state_of(model, opt, {"epoch": save_step, "offset": 0})
    checkpoint.save(state, save_step, async_save=async_save)
    return result


def growing_main(refs: str, release: str) -> dict:
    """World 1 trains and saves sharded and async each step, frees a slot at step 2 and
    goes on until the job grows (once a save is committed, rank 0's next save raises
    Resize); world 2 resumes from that checkpoint and checks its parameters."""
    import time

    import torch.distributed as dist

    dist.init_process_group("gloo")
    world = dist.get_world_size()
    model, opt = fsdp_model()
    found, _ = resume_into(model, opt)
    if world == 2:
        same = same_as_reference(model, refs, found.step)
        dist.destroy_process_group()
        return {"resumed": found.step, "from_world": found.world_size, "same": same}
    deadline = time.monotonic() + 120
    step = found.step if found else 0
    while time.monotonic() < deadline:
        step += 1
        train_step(model, opt, step)
        save_reference(model, refs, step)
        checkpoint.save(state_of(model, opt, {"epoch": step, "offset": 0}), step, async_save=True)
        if step == 2:
            Path(release).touch()
        time.sleep(0.2)
    raise AssertionError("the job never grew")


# --- tests --------------------------------------------------------------------------


def committed_names(directory: Path) -> set[str]:
    records = [json.loads(p.read_text()) for p in directory.glob("checkpoint-*.commit.json")]
    return {r["name"] for r in records}


def test_killed_mid_save_resumes_previous_commit_then_async_save_and_resharding(sc, tmp_path):
    store, refs = tmp_path / "store", tmp_path / "refs"
    refs.mkdir()
    runner = sparkdist.HorovodRunner(np=2, max_failures=1, checkpoint_dir=str(store))
    results = runner.run_all(killed_then_async_main, refs=str(refs))

    assert runner.last_job.attempts == 2 and "SIGKILL" in runner.last_job.failures[0]
    for result in results:  # the half-written step 2 was never read
        assert result["resumed"] == 1 and result["from_world"] == 2
        assert result["same"] and result["data"] == {"epoch": 1, "offset": 11}
    events = results[0]["events"]
    # Training went on while the async save was in flight; it was committed only
    # once written (the gate opened after step 5), and then at once.
    assert events == [
        ("saved async", 2, [1]),
        ("trained", 3, [1]),
        ("trained", 4, [1]),
        ("trained", 5, [1]),
        ("waited", 5, [1, 2]),
    ]
    # Only committed directories remain: attempt 0's partial step 2 was removed.
    shards = {p.name for p in (store / "sharded").iterdir()}
    assert shards == committed_names(store) and len(shards) == 2
    assert all((store / "sharded" / name / ".metadata").is_file() for name in shards)

    # A world of 3 (ranks on the driver) resumes what 2 saved, and saves step 3 ...
    three = sparkdist.HorovodRunner(np=-3, checkpoint_dir=str(store))
    for result in three.run_all(reshard_main, refs=str(refs), save_step=3):
        assert (result["resumed"], result["from_world"], result["world"]) == (2, 2, 3)
        assert result["same"] and result["data"] == {"epoch": 2, "offset": 22}
    # ... which a world of 2 on the cluster resumes.
    two = sparkdist.HorovodRunner(np=2, checkpoint_dir=str(store))
    for result in two.run_all(reshard_main, refs=str(refs), save_step=4, async_save=True):
        assert (result["resumed"], result["from_world"], result["world"]) == (3, 3, 2)
        assert result["same"] and result["data"] == {"epoch": 3, "offset": 0}
    # The end of main waited for the async save of step 4 and its commit; keep=2 covers
    # sharded checkpoints.
    assert CheckpointStore(store).steps() == [3, 4]
    assert len(list((store / "sharded").iterdir())) == 2


def test_elastic_job_grows_after_a_sharded_save_and_resumes_from_it(sc, tmp_path):
    holder = SlotHolder(sc, tmp_path, slots=1)
    refs, release = tmp_path / "refs", tmp_path / "release"
    refs.mkdir()
    holder.release_when(release)
    runner = sparkdist.HorovodRunner(
        np=2, min_np=1, max_np=2, checkpoint_dir=str(tmp_path / "store")
    )
    results = runner.run_all(growing_main, refs=str(refs), release=str(release))
    assert runner.last_job.attempts == 2
    assert runner.last_job.failures[0].startswith("grew: 1 more rank slot(s) free")
    assert len(results) == 2
    for result in results:
        assert result["from_world"] == 1 and result["resumed"] >= 2 and result["same"]
    assert still_alive(runner) == []


def test_sharded_checkpoints_on_an_fsspec_url():
    """A checkpoint_dir given as an fsspec URL: DCP writes through fsspec, the store
    commits and prunes through pyarrow's fsspec handler (one process: memory://)."""
    import fsspec
    import torch
    import torch.distributed.checkpoint as dcp

    store = CheckpointStore("memory://sparkdist-test/sharded-run", keep=1)
    for step in (1, 2):
        location = store.shard_location(step, "jobA")
        assert location == f"memory://sparkdist-test/sharded-run/sharded/step-{step:012d}-jobA"
        state = {"weights": torch.full((3,), float(step)), "data": {"offset": step}}
        dcp.save(state, checkpoint_id=location, no_dist=True)
        store.commit(step, 1, location, "torch-dcp")
    into = {"weights": torch.zeros(3), "data": {"offset": 0}}
    dcp.load(into, checkpoint_id=store.latest()[1]["location"], no_dist=True)
    assert torch.equal(into["weights"], torch.full((3,), 2.0)) and into["data"] == {"offset": 2}
    memory = fsspec.filesystem("memory")
    assert memory.ls("/sparkdist-test/sharded-run/sharded", detail=False) == [
        "/sparkdist-test/sharded-run/sharded/step-000000000002-jobA"
    ]


def over_limit_main() -> dict:
    """Refused on the driver path; then what the message says (sharded=True) works;
    then a small driver-path save replaces it (checkpoint_keep=1)."""
    import torch

    state = {"weights": torch.ones(2**19)}  # 2 MiB
    try:
        checkpoint.save(state, 1)
    except ValueError as exc:
        refused = str(exc)
    after_refusal = checkpoint.committed_steps()
    checkpoint.save(state, 2, sharded=True)
    into = {"weights": torch.zeros(2**19)}
    found = checkpoint.resume(into=into)
    checkpoint.save({"weights": torch.zeros(16)}, 3)
    return {
        "refused": refused,
        "after": after_refusal,
        "steps": checkpoint.committed_steps(),
        "sharded": (found.step, bool(into["weights"].eq(1).all())),
    }


def test_driver_path_refuses_a_state_over_the_limit_before_sending(sc, tmp_path):
    store = tmp_path / "store"
    runner = sparkdist.HorovodRunner(
        np=-1, checkpoint_dir=str(store), checkpoint_keep=1, env={checkpoint.DRIVER_LIMIT_ENV: "1"}
    )
    result = runner.run(over_limit_main)
    assert "checkpoint 1 is 2 MiB, over the driver path's limit of 1 MiB" in result["refused"]
    assert "checkpoint_dir" in result["refused"] and "sharded=True" in result["refused"]
    assert result["after"] == []  # the refused state never reached the driver
    assert result["sharded"] == (2, True)
    assert result["steps"] == [3]  # checkpoint_keep=1, over both paths
    stored = sorted(p.name for p in store.iterdir() if p.name != "logs")  # logs: the ranks' output
    assert stored == ["checkpoint-000000000003.pkl", "sharded"]
    assert list((store / "sharded").iterdir()) == []


def test_a_driver_path_checkpoint_saved_before_the_rank_modules_moved_still_loads():
    """checkpoint-<step>.pkl files outlive a sparkdist upgrade: a state pickled when the
    driver path was `sparkdist.checkpoint.driver_path` still unpacks, with its world size."""
    import pickle

    from sparkdist.checkpoint.rank import driver_path

    blob = pickle.dumps(driver_path._Saved({"w": [1.5, 2.5]}, 3), protocol=2)
    old = blob.replace(
        b"sparkdist.checkpoint.rank.driver_path", b"sparkdist.checkpoint.driver_path"
    )
    assert old != blob and b"sparkdist.checkpoint.driver_path\n" in old
    assert driver_path.unpack(old) == driver_path._Saved({"w": [1.5, 2.5]}, 3)
    assert isinstance(driver_path.unpack(old), checkpoint._Saved)


def test_sharded_record_retention_pins_and_partial_directories(tmp_path):
    store = CheckpointStore(tmp_path, keep=1)
    with pytest.raises(ValueError, match="pass HorovodRunner\\(checkpoint_dir=...\\)"):
        CheckpointStore(keep=1).shard_location(1, "job")
    first = store.shard_location(1, "jobA")
    assert first == str(tmp_path / "sharded" / "step-000000000001-jobA")
    os.makedirs(first)
    store.commit(1, 2, first, "torch-dcp")
    partial = store.shard_location(2, "jobA")  # a crash mid-save of step 2
    os.makedirs(partial)
    later = store.shard_location(3, "jobB")  # a save the ranks have begun
    os.makedirs(later)
    step, record = store.latest(reader=("jobB", 0))
    assert (step, record["world_size"], record["location"]) == (1, 2, first)
    second = store.shard_location(2, "jobB")
    os.makedirs(second)
    store.commit(2, 3, second, "torch-dcp")
    # Step 1 is beyond keep=1 but a rank is reading it; the partial step 2 is gone; a
    # later step's directory is left to its writers.
    assert store.steps() == [1, 2]
    assert sorted(os.listdir(tmp_path / "sharded")) == [
        "step-000000000001-jobA",
        "step-000000000002-jobB",
        "step-000000000003-jobB",
    ]
    store.unpin(("jobB", 0))
    assert store.steps() == [2]
    assert not os.path.exists(first)
    assert store.latest()[1]["location"] == second
    with pytest.raises(ValueError, match="is not under"):
        store.commit(4, 1, "/elsewhere/step-4", "torch-dcp")


def test_bad_checkpoint_options_are_refused_at_once():
    with pytest.raises(ValueError, match="checkpoint_keep must be an int >= 1"):
        sparkdist.HorovodRunner(np=2, checkpoint_keep=0)
    with pytest.raises(ValueError, match="async_save=True writes shards from every rank"):
        checkpoint.save({"step": 1}, 1, async_save=True)
