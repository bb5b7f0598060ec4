"""TensorFlow backend end to end: Keras `fit` under MultiWorkerMirroredStrategy on two
ranks placed by real Spark (local-cluster), with the TF_CONFIG sparkdist builds."""

from __future__ import annotations

import errno
import json
import socket

import pytest
from installed import requires

from sparkdist import HorovodRunner
from sparkdist.backends.tensorflow import reserve_shared_port, tf_config

pytestmark = requires("tensorflow", "pip install tensorflow-cpu (make venv)")


def keras_mwms_main(model_dir: str, epochs: int) -> dict:
    """The demo's Keras training under MultiWorkerMirroredStrategy, plus what the test
    checks: this rank's TF_CONFIG, and rank 0's saved model loaded back and scored."""
    import json
    import os

    import tensorflow as tf

    from sparkdist.demos.digits import load_digits_split
    from sparkdist.demos.keras_digits import train_digits_keras

    result = train_digits_keras(epochs=epochs, model_dir=model_dir)
    result["rank"] = int(os.environ["RANK"])
    result["tf_config"] = json.loads(os.environ["TF_CONFIG"])
    if result["saved"]:
        _, x_test, _, y_test = load_digits_split()
        restored = tf.keras.models.load_model(result["saved"])
        predicted = restored.predict(x_test, verbose=0).argmax(axis=1)
        result["restored_accuracy"] = float((predicted == y_test).mean())
    return result


def test_keras_fit_multi_worker_mirrored_np2(sc, tmp_path):
    runner = HorovodRunner(np=2, start_timeout=180, timeout=300)
    results = runner.run_all(keras_mwms_main, model_dir=str(tmp_path), epochs=5)

    assert [r["rank"] for r in results] == [0, 1]
    workers = results[0]["tf_config"]["cluster"]["worker"]
    assert len(workers) == 2 and len(set(workers)) == 2
    assert all(w.startswith("127.0.0.1:") for w in workers)
    for rank, result in enumerate(results):
        assert result["tf_config"]["cluster"]["worker"] == workers
        assert result["tf_config"]["task"] == {"type": "worker", "index": rank}
        assert result["ranks"] == 2
        assert len(result["loss"]) == 5 and result["loss"][-1] < result["loss"][0]
    # The replicas trained one model: the same losses on both ranks.
    assert results[0]["loss"] == results[1]["loss"]
    assert results[0]["accuracy"] > 0.9
    # Only rank 0 saved, and what it saved is the trained model.
    assert results[1]["saved"] is None
    assert [p.name for p in tmp_path.iterdir()] == ["digits.keras"]
    assert results[0]["restored_accuracy"] == results[0]["accuracy"]


def test_tf_config_shape():
    assert tf_config(["h:1", "h:2"], 1) == {
        "cluster": {"worker": ["h:1", "h:2"]},
        "task": {"type": "worker", "index": 1},
    }
    json.dumps(tf_config(["h:1"], 0))


def test_a_reserved_port_is_kept_from_others_and_shared_with_a_reuseport_listener():
    """A multi-host run failed with "Could not start gRPC server": the reservation had
    SO_REUSEADDR, so another SO_REUSEADDR socket could bind its port and listen first."""
    reservation = reserve_shared_port("127.0.0.1")
    port = reservation.getsockname()[1]
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    grpc_like = socket.socket()
    grpc_like.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        with pytest.raises(OSError) as refused:
            other.bind(("0.0.0.0", port))
        assert refused.value.errno == errno.EADDRINUSE
        grpc_like.bind(("0.0.0.0", port))  # what TF_GRPC_REUSE_PORT=1's server does
        grpc_like.listen()
    finally:
        for sock in (reservation, other, grpc_like):
            sock.close()
