"""Peers of a real `DriverService` in the tests: a rank's client opened in the test
process, and rank processes spawned against the service as tasks would launch them."""

from __future__ import annotations

import multiprocessing
import os

from sparkdist import job_environment
from sparkdist.protocol import driver_channel, messages, wire
from sparkdist.protocol.job_secret import JobSecret
from sparkdist.runner.driver.job_spec import JobSpec
from sparkdist.runner.driver.job_state import JobState
from sparkdist.runner.driver.service import DriverService

REPLY_TIMEOUT_S = 30
ELASTIC_TIMEOUT_S = 3.0
"""The elastic timeout the spawned ranks run with."""


def rank_client(
    service, secret: wire.JobSecret, rank: int, payload=b"payload"
) -> driver_channel.DriverClient:
    address = (
        service.address if isinstance(service.address, str) else "{}:{}".format(*service.address)
    )
    client = driver_channel.DriverClient(address, secret)
    client._channel.sock.settimeout(REPLY_TIMEOUT_S)
    welcome = client.request(messages.RankHello(rank, "127.0.0.1", os.getpid()))
    assert welcome.payload == payload
    return client


def connect_rank(rank: int, world_size: int, address: str, secret_text: str) -> None:
    """What `rank/main.py` does before the user's function, for a spawned test rank."""
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            job_environment.TASK_HOST: "127.0.0.1",
            job_environment.ELASTIC_TIMEOUT_S: str(ELASTIC_TIMEOUT_S),
        }
    )
    client = driver_channel.connect(address, JobSecret.from_text(secret_text))
    client.request(messages.RankHello(rank, "127.0.0.1", os.getpid()))


class SpawnedRanks:
    """A real `DriverService` and `world_size` spawned rank processes connected to it."""

    def __init__(self, world_size: int, target, extra):
        self.state = JobState(JobSpec("job", world_size, b"payload", False, "all"))
        self.secret = wire.new_secret()
        self.service = DriverService(self.state, self.secret, "127.0.0.1", "127.0.0.1")
        address = self.service.address
        address = address if isinstance(address, str) else "{}:{}".format(*address)
        context = multiprocessing.get_context("spawn")
        self.procs = [
            context.Process(
                target=target, args=(r, world_size, address, self.secret.to_text(), extra)
            )
            for r in range(world_size)
        ]
        for proc in self.procs:
            proc.start()

    def close(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
            proc.join()
        self.service.close()
