"""Torch backend end to end: DistributedDataParallel on digits (`sparkdist.demos.digits`)
under HorovodRunner matches a single-process run of the same code and model, on real
Spark (np=2) and on the driver (np=-2)."""

from __future__ import annotations

import pytest

from sparkdist import HorovodRunner
from sparkdist.backends.gpu import torch_process_group_backend
from sparkdist.demos.digits import train_digits_ddp

EPOCHS = 10


@pytest.fixture(scope="module")
def single_process_accuracy():
    """The same function in a world of one process: this one."""
    import torch

    from sparkdist.network import reserve_port

    with pytest.MonkeyPatch.context() as patch, reserve_port("127.0.0.1") as port:
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port.getsockname()[1])}
        env.update(RANK="0", WORLD_SIZE="1", GLOO_SOCKET_IFNAME="lo")
        for name, value in env.items():
            patch.setenv(name, value)
        threads = torch.get_num_threads()
        port.close()
        try:
            result = train_digits_ddp(epochs=EPOCHS)
        finally:
            torch.set_num_threads(threads)
    assert result["ranks"] == 1
    return result["accuracy"]


@pytest.mark.parametrize("np_, launcher", [(2, "direct"), (-2, "mpi")])
def test_ddp_digits_matches_single_process(sc, single_process_accuracy, np_, launcher):
    result = HorovodRunner(np=np_, launcher=launcher, timeout=300).run(
        train_digits_ddp, epochs=EPOCHS
    )
    assert result["ranks"] == 2
    assert single_process_accuracy > 0.9
    assert abs(result["accuracy"] - single_process_accuracy) <= 0.02, (
        result["accuracy"],
        single_process_accuracy,
    )


def test_process_group_backend_is_gloo_without_gpus():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert torch_process_group_backend() == "gloo"


def test_torch_master_port_is_drawn_outside_the_kernels_own_range():
    """A port below the ephemeral range cannot be handed by the kernel to another
    process's bind(0) or outgoing connection between reservation and TCPStore's bind."""
    import socket

    from sparkdist.network import _ephemeral_ports, reserve_port

    low, _ = _ephemeral_ports()
    with reserve_port("127.0.0.1") as reservation:
        port = reservation.getsockname()[1]
    assert 20000 <= port < low
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind(("127.0.0.1", port))  # as TCPStore takes it over
        listener.listen()
    finally:
        listener.close()
