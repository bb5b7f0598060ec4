"""Horovod backend end to end: unmodified `horovod.torch` code under HorovodRunner, on
real Spark (local-cluster, np=2) and on the driver (np=-2), through mpirun (MPI
controller) and through the direct launcher (Gloo controller with sparkdist's
rendezvous); a Horovod timeline brought back to the driver; and the message a rank gets
for `import horovod.tensorflow`."""

from __future__ import annotations

import json

import pytest
from installed import requires

from sparkdist import HorovodRunner, RankFailedError
from sparkdist.backends.horovod import horovod_tensorflow_message, host_alloc_plan

pytestmark = [
    pytest.mark.horovod,
    requires("horovod", "run `make horovod` (init_scripts/install_horovod.sh)"),
]

EPOCHS = 10


def digits() -> tuple:
    """Digits as float32 arrays, split the same way as `sparkdist.demos.digits`; passed
    to the ranks as arguments so that they need not import scikit-learn."""
    from sparkdist.demos.digits import load_digits_split

    return tuple(load_digits_split())


def train(data: tuple, epochs: int, hvd=None, lr: float = 0.01, batch_size: int = 32):
    """Train the digits model; with `hvd`, on this rank's shard with Horovod's
    DistributedOptimizer and broadcast_parameters. Returns (model, test accuracy)."""
    import torch

    from sparkdist.demos.digits import accuracy, make_model

    torch.manual_seed(0)
    torch.set_num_threads(1)
    rank, size = (hvd.rank(), hvd.size()) if hvd else (0, 1)
    x_train, x_test, y_train, y_test = data
    x_shard = torch.from_numpy(x_train[rank::size])
    y_shard = torch.from_numpy(y_train[rank::size])
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    if hvd:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    loss_fn = torch.nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(rank)
    for _ in range(epochs):
        order = torch.randperm(len(x_shard), generator=generator)
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            optimizer.zero_grad()
            loss_fn(model(x_shard[idx]), y_shard[idx]).backward()
            optimizer.step()
    return model, accuracy(model, x_test, y_test)


def horovod_digits_main(data: tuple, epochs: int) -> dict:
    """Plain Horovod code: init, check the layout and an allreduce, then train."""
    import os

    import horovod.torch as hvd
    import torch

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    total = hvd.allreduce(torch.tensor([rank + 1.0, 10.0]), op=hvd.Sum, name="check")
    model, test_accuracy = train(data, epochs, hvd)
    # Every rank ends with the same weights.
    checksum = sum(float(p.sum()) for p in model.parameters())
    checksums = hvd.allgather_object(checksum)
    result = {
        "rank": rank,
        "size": size,
        "local_rank": hvd.local_rank(),
        "local_size": hvd.local_size(),
        "cross_rank": hvd.cross_rank(),
        "cross_size": hvd.cross_size(),
        "controller": "mpi" if hvd.mpi_enabled() else "gloo" if hvd.gloo_enabled() else "?",
        "sum": total.tolist(),
        "env": {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")},
        "accuracy": test_accuracy,
        "same_weights": len(set(checksums)) == 1,
    }
    hvd.shutdown()
    return result


@pytest.fixture(scope="module")
def data():
    return digits()


@pytest.fixture(scope="module")
def single_process_accuracy(data):
    """The same model and loop trained by one ordinary process, without Horovod."""
    _, test_accuracy = train(data, EPOCHS)
    assert test_accuracy > 0.9
    return test_accuracy


@pytest.mark.parametrize(
    "np_, launcher",
    [(2, "mpi"), (2, "direct"), (-2, "mpi"), (-2, "direct")],
)
def test_horovod_torch_unmodified(sc, data, single_process_accuracy, np_, launcher):
    runner = HorovodRunner(np=np_, launcher=launcher, start_timeout=120, timeout=300)
    results = runner.run_all(horovod_digits_main, data=data, epochs=EPOCHS)

    expected_controller = "mpi" if launcher == "mpi" else "gloo"
    for rank, r in enumerate(results):
        assert r["rank"] == rank and r["size"] == 2
        assert r["controller"] == expected_controller
        assert r["sum"] == [3.0, 20.0]
        # Horovod's layout is sparkdist's: each Spark task is a host (np=2), the driver
        # is one host (np=-2).
        assert r["local_rank"] == int(r["env"]["LOCAL_RANK"])
        assert r["local_size"] == int(r["env"]["LOCAL_WORLD_SIZE"])
        if np_ > 0:
            assert (r["local_rank"], r["local_size"], r["cross_rank"], r["cross_size"]) == (
                0,
                1,
                rank,
                2,
            )
        else:
            assert (r["local_rank"], r["local_size"], r["cross_rank"], r["cross_size"]) == (
                rank,
                2,
                0,
                1,
            )
        assert r["same_weights"]
        assert abs(r["accuracy"] - single_process_accuracy) <= 0.02, (
            r["accuracy"],
            single_process_accuracy,
        )


def timeline_main() -> float:
    import horovod.torch as hvd
    import torch

    hvd.init()
    value = 0.0
    for step in range(5):
        value = hvd.allreduce(torch.ones(1000) * (hvd.rank() + 1), op=hvd.Sum, name=f"t{step}")
    return float(value[0])


def _assert_chrome_trace_with_allreduce(path) -> None:
    events = json.loads(path.read_text())  # valid JSON, not just Chrome-tolerable
    assert isinstance(events, list) and events
    names = {e.get("name", "") for e in events}
    assert any("ALLREDUCE" in n for n in names), sorted(names)[:20]
    assert any(e.get("ph") in ("B", "X") for e in events)
    tensors = {e.get("args", {}).get("name") for e in events if e.get("ph") == "M"}
    assert {"allreduce.t0", "allreduce.t4"} <= tensors, tensors


def test_timeline_option_on_the_cluster(sc, tmp_path):
    """Rank 0 runs in an executor; the file lands where the driver asked."""
    path = tmp_path / "sub" / "timeline.json"
    runner = HorovodRunner(np=2, launcher="mpi", timeline=str(path))
    assert runner.run(timeline_main) == 3.0
    _assert_chrome_trace_with_allreduce(path)
    assert runner.last_job.files["horovod_timeline"] == path.read_bytes()


def test_timeline_from_driver_environment(sc, tmp_path, monkeypatch):
    """As Databricks documents: HOROVOD_TIMELINE set in the driver's environment."""
    path = tmp_path / "timeline.json"
    monkeypatch.setenv("HOROVOD_TIMELINE", str(path))
    assert HorovodRunner(np=2, launcher="direct").run(timeline_main) == 3.0
    _assert_chrome_trace_with_allreduce(path)


@requires("tensorflow", "pip install tensorflow-cpu (make venv)")
def test_horovod_tensorflow_import_explains(sc):
    def main():
        import horovod.tensorflow as hvd  # noqa: F401

    with pytest.raises(RankFailedError) as info:
        HorovodRunner(np=-2, launcher="direct").run(main)
    message = str(info.value)
    assert "ImportError" in message
    assert "TensorFlow 2.16 and later" in message
    assert "MultiWorkerMirroredStrategy" in message and "HorovodRunner" in message


def test_alloc_plan_matches_horovod():
    """The layout is Horovod's own `get_host_assignments`."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    hosts = [("a", 0, 3), ("a", 1, 3), ("a", 2, 3), ("b", 0, 2), ("b", 1, 2), ("c", 0, 1)]
    expected = get_host_assignments(parse_hosts("a:3,b:2,c:1"), 6)
    ours = host_alloc_plan(hosts)
    for mine, theirs in zip(ours, expected, strict=True):
        assert (
            mine.hostname,
            mine.rank,
            mine.local_rank,
            mine.cross_rank,
            mine.size,
            mine.local_size,
            mine.cross_size,
        ) == (
            theirs.hostname,
            theirs.rank,
            theirs.local_rank,
            theirs.cross_rank,
            theirs.size,
            theirs.local_size,
            theirs.cross_size,
        )


def test_message_names_the_way_forward():
    message = horovod_tensorflow_message("2.21.0")
    assert "2.21.0" in message and "MultiWorkerMirroredStrategy" in message
