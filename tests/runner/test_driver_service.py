"""The driver's service is event-driven: its threads do not grow with its peers, and a
rendezvous read that waits holds no thread (real TLS + HMAC connections, real service)."""

from __future__ import annotations

import os
import threading
import time

import pytest
from driver_peers import REPLY_TIMEOUT_S, rank_client

from sparkdist.errors import JobFailedError
from sparkdist.protocol import messages, wire
from sparkdist.runner.driver.job_spec import JobSpec
from sparkdist.runner.driver.job_state import JobState
from sparkdist.runner.driver.service import DriverService
from sparkdist.runner.task.relay import HostRelay

PEERS = 200


def _service(num_ranks: int) -> tuple[JobState, wire.JobSecret, DriverService]:
    state = JobState(JobSpec("job", num_ranks, b"payload", False, "all"))
    secret = wire.new_secret()
    return state, secret, DriverService(state, secret, "127.0.0.1", "127.0.0.1")


class _Task:
    """A task's channel to the driver and its relay, as `TaskRun` opens them."""

    def __init__(self, service: DriverService, secret: wire.JobSecret, index: int):
        self.channel = wire.connect(service.address, secret)
        self.channel.send(messages.encode(messages.TaskHello(index, "127.0.0.1", os.getpid())))
        self.relay = HostRelay(secret, lambda m: self.channel.send(messages.encode(m)))
        self.address = self.relay.address
        threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self) -> None:
        try:
            while True:
                order = messages.decode(self.channel.recv(), messages.TASK_ORDERS)
                if isinstance(order, messages.RELAY_FRAMES):
                    self.relay.deliver(order)
        except (EOFError, OSError):
            self.relay.close()

    def close(self) -> None:
        self.relay.close()
        self.channel.close()


def test_driver_threads_do_not_grow_with_connected_peers():
    state, secret, service = _service(PEERS)
    try:
        before = set(threading.enumerate())
        clients = [rank_client(service, secret, rank) for rank in range(PEERS)]
        for rank, client in enumerate(clients):  # every one is served, all connected
            client.put(f"k{rank}", rank)
        started = set(threading.enumerate()) - before  # (earlier tests' threads may end)
        assert service.connections_max == PEERS
        assert not started, f"{len(started)} threads more with {PEERS} peers: {started}"
        assert all(state.ranks[r].started for r in range(PEERS))
        assert service.payload_bytes_sent == PEERS * len(b"payload")
        for client in clients:
            client._channel.close()
    finally:
        service.close()


def test_waiting_rendezvous_reads_hold_no_thread():
    """Ranks wait for a key none has put yet; the put answers all of them, and a read
    of a key never put ends at its own timeout with `Missing`."""
    _, secret, service = _service(PEERS)
    try:
        readers = [rank_client(service, secret, rank) for rank in range(1, 21)]
        before = set(threading.enumerate())
        for reader in readers:
            reader._channel.send(messages.encode(messages.KvGet("master", 60.0)))
        assert not set(threading.enumerate()) - before
        rank_client(service, secret, 0).put("master", ("host", 1234))
        for reader in readers:
            assert messages.decode(reader._channel.recv(), messages.RANK_REPLIES) == (
                messages.Ok(("host", 1234))
            )
        reply = readers[0].request(messages.KvGet("never", 0.2))
        assert isinstance(reply, messages.Missing)
    finally:
        service.close()


def test_relays_fan_in_by_task_and_send_the_payload_once_per_task():
    """Two tasks of four ranks each: the driver holds two connections, every rank gets
    the whole payload, the driver sends it twice, and a rank's requests are answered
    through its relay."""
    payload = os.urandom(3 << 20)
    state = JobState(JobSpec("job", 8, payload, False, "all", ranks_per_task=4))
    secret = wire.new_secret()
    service = DriverService(state, secret, "127.0.0.1", "127.0.0.1")
    tasks = [_Task(service, secret, index) for index in range(2)]
    try:
        ranks = [rank_client(tasks[r // 4], secret, r, payload) for r in range(8)]
        ranks[5].put("k", 5)
        assert ranks[2].get("k", timeout_s=10) == 5
        ranks[7].send_file("big", payload)  # a large frame up: checked off the loop
        assert state.files["big"] == payload
        assert service.connections_max == 2
        assert service.payload_bytes_sent == 2 * len(payload)
        assert all(state.ranks[r].started for r in range(8))
    finally:
        for task in tasks:
            task.close()
        service.close()


def test_a_supervisor_through_a_relay_ends_or_is_lost_as_over_its_own_connection():
    """A supervisor that reports its rank's exit gets `Bye` through the relay; one whose
    connection breaks before that fails the job as a lost rank."""
    state = JobState(JobSpec("job", 2, b"payload", False, "all", ranks_per_task=2))
    secret = wire.new_secret()
    service = DriverService(state, secret, "127.0.0.1", "127.0.0.1")
    task = _Task(service, secret, 0)
    try:
        supervisors = []
        for rank in range(2):
            channel = wire.connect(("127.0.0.1", int(task.address.split(":")[1])), secret)
            channel.sock.settimeout(REPLY_TIMEOUT_S)
            channel.send(messages.encode(messages.SupervisorHello(rank, "127.0.0.1", os.getpid())))
            supervisors.append(channel)
        supervisors[0].send(messages.encode(messages.RankExit(0, [])))
        assert messages.decode(supervisors[0].recv(), messages.ORDERS) == messages.Bye()
        with pytest.raises((EOFError, ConnectionError)):
            supervisors[0].recv()  # the driver was done with it: its relay closed it
        supervisors[1].close()
        with pytest.raises(JobFailedError, match="lost contact with rank 1"):
            state.failures.wait(None, time.monotonic() + 30, launcher_expected=False)
        assert state.ranks[0].exited
    finally:
        task.close()
        service.close()


def test_where_hello_is_answered_once_with_the_grouped_stacks():
    """A relayed job's interrupted client asks task 0's service so (through a plain
    Spark task): no rank runs yet, so the answer is empty; the service goes on."""
    state, secret, service = _service(1)
    try:
        channel = wire.connect(service.address, secret)
        channel.sock.settimeout(REPLY_TIMEOUT_S)
        raw = channel.request(messages.encode(messages.WhereHello("interrupted")))
        assert messages.decode(raw, (messages.Ok,)) == messages.Ok("")
        channel.close()
        rank_client(service, secret, 0)._channel.close()
        assert state.ranks[0].started
    finally:
        service.close()
