"""Peers of a real `DriverService` in the tests: a rank's client opened in the test
process, and rank processes spawned against the service as tasks would launch them."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Iterator
from typing import NamedTuple

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


class ElasticPeers(NamedTuple):
    """A real `DriverService` of an in-process elastic job and its ranks' clients."""

    state: JobState
    service: DriverService
    secret: wire.JobSecret
    ranks: list[driver_channel.DriverClient]

    def client(self, rank: int) -> driver_channel.DriverClient:
        """A client for launch rank `rank` (a newcomer the test seated)."""
        return rank_client(self.service, self.secret, rank)


@contextlib.contextmanager
def elastic_driver(num_ranks: int, min_np: int) -> Iterator[ElasticPeers]:
    """The driver's side of an in-process elastic job without Spark: a real `DriverService`
    and a client per rank, each entered in generation 0 (`ElasticWorld(after=-1)`)."""
    spec = JobSpec("job", num_ranks, b"payload", False, "all", in_process_min_np=min_np)
    state = JobState(spec)
    secret = wire.new_secret()
    service = DriverService(state, secret, "127.0.0.1", "127.0.0.1")
    try:
        ranks = [rank_client(service, secret, rank) for rank in range(num_ranks)]
        first = messages.Ok(messages.Generation(0, tuple(range(num_ranks)), "start"))
        for rank, client in enumerate(ranks):
            assert client.request(messages.ElasticWorld(rank, -1, 5.0)) == first
        yield ElasticPeers(state, service, secret, ranks)
    finally:
        service.close()


def send(client: driver_channel.DriverClient, request: tuple) -> None:
    """Send `request` without waiting for its reply (a rank that waits): `reply` reads it."""
    client._channel.send(messages.encode(request))


def reply(client: driver_channel.DriverClient) -> tuple:
    """The reply to the request `send` sent."""
    return messages.decode(client._channel.recv(), messages.RANK_REPLIES)


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
