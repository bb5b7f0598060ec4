"""The runner's channel contracts: every server answers a request it does not know, or
one with the wrong fields, with an explicit `Rejected` instead of leaving its peer
waiting; the records survive the wire unchanged."""

from __future__ import annotations

import os
import socket

import pytest

from sparkdist.protocol import driver_channel, messages, wire
from sparkdist.protocol.processes import ProcessRecord
from sparkdist.runner.driver.job_spec import JobSpec
from sparkdist.runner.driver.job_state import JobState
from sparkdist.runner.driver.service import DriverService
from sparkdist.runner.task.agent import TaskAgent
from sparkdist.tune.messages import TrialCall

# A reply that never comes fails the test instead of hanging it.
REPLY_TIMEOUT_S = 10


@pytest.fixture
def driver():
    state = JobState(JobSpec("job", 2, b"payload", False, "all"))
    secret = wire.new_secret()
    service = DriverService(state, secret, "127.0.0.1", "127.0.0.1")
    yield state, secret, service
    service.close()


def _connect(address, secret) -> wire.Channel:
    channel = wire.connect(address, secret)
    channel.sock.settimeout(REPLY_TIMEOUT_S)
    return channel


def _rank_client(service: DriverService, secret: bytes) -> driver_channel.DriverClient:
    client = driver_channel.DriverClient(f"{service.address[0]}:{service.address[1]}", secret)
    client._channel.sock.settimeout(REPLY_TIMEOUT_S)
    welcome = client.request(messages.RankHello(1, "127.0.0.1", os.getpid()))
    assert welcome._replace(clock_us=-1.0) == messages.Welcome(b"payload", False, "job")
    assert 0 <= welcome.clock_us <= service.state.trace.now_us()  # the trace's clock, µs
    return client


def test_rank_request_of_unknown_kind_is_rejected_not_left_waiting(driver):
    state, secret, service = driver
    client = _rank_client(service, secret)
    raw = client._channel.request(("shutdown_everything", 1))
    assert raw[0] == "rejected" and "unknown request 'shutdown_everything'" in raw[1]
    # The channel still works after the rejection.
    client.put("k", 7)
    assert client.get("k", timeout_s=1) == 7


@pytest.mark.parametrize(
    "raw, why",
    [
        (("put", "only-a-key"), "takes 2 fields"),
        (("get", 3, 1.0), "field key must be str"),
        (("checkpoint_save", "step", b"x"), "field step must be int"),
        ("not a tuple", "not a tagged message"),
        (("finish", "a driver's order, not a request"), "unknown request 'finish'"),
    ],
)
def test_malformed_rank_request_is_rejected(driver, raw, why):
    _, secret, service = driver
    client = _rank_client(service, secret)
    with pytest.raises(messages.RequestRejected, match=why):
        messages.reply_to(client._channel.request(raw), messages.RANK_REPLIES)


def test_unknown_hello_is_rejected_and_changes_nothing(driver):
    state, secret, service = driver
    channel = _connect(service.address, secret)
    channel.send(("root", 0, "127.0.0.1", 1))
    kind, reason = channel.recv()
    assert kind == "rejected" and "unknown request 'root'" in reason
    assert not any(r.started for r in state.ranks.values()) and not state.tasks.started


def test_malformed_supervisor_report_is_rejected_and_the_stream_goes_on(driver):
    state, secret, service = driver
    channel = _connect(service.address, secret)
    channel.send(messages.encode(messages.SupervisorHello(0, "127.0.0.1", os.getpid())))
    channel.send(("output", "not a list"))
    assert channel.recv()[0] == "rejected"
    channel.send(messages.encode(messages.RankOutput([("stdout", "hello")])))
    channel.send(messages.encode(messages.RankExit(0, [])))
    assert messages.decode(channel.recv(), messages.ORDERS) == messages.Bye()
    assert state.ranks[0].exited and list(state.ranks[0].tail) == ["hello"]


def test_task_0_gets_every_agent_place_in_task_order_once_all_arrived(driver):
    state, secret, service = driver
    tasks = [_connect(service.address, secret) for _ in range(2)]
    places = [messages.AgentPlace("127.0.0.1", 4000 + i, "127.0.0.0/8") for i in range(2)]
    for index in (1, 0):  # task 0 hears nothing until task 1's place (sent first) and its own
        tasks[index].send(messages.encode(messages.TaskHello(index, "127.0.0.1", os.getpid())))
    tasks[1].send(messages.encode(places[1]))
    tasks[0].send(messages.encode(places[0]))
    order = messages.decode(tasks[0].recv(), messages.TASK_ORDERS)
    assert order == messages.AgentPlaces(places)
    state.stop("finish", "done")
    assert messages.decode(tasks[1].recv(), messages.TASK_ORDERS) == messages.Finish("done")


def test_task_agent_rejects_unknown_request():
    secret = wire.new_secret()
    records: list[ProcessRecord] = []
    agent = TaskAgent(secret, "127.0.0.1", dict(os.environ), records.append)
    try:
        channel = _connect(("127.0.0.1", agent.port), secret)
        channel.send(("run", "orted"))
        reply = messages.decode(channel.recv(), messages.AGENT_REPLIES)
        assert isinstance(reply, messages.Rejected) and "unknown request 'run'" in reply.reason
        assert records == []
    finally:
        agent.close()


def test_tune_service_rejects_malformed_call():
    from sparkdist.tune.service import TrialService

    service = TrialService("127.0.0.1", "127.0.0.1")
    try:
        channel = _connect(service.address, service._secret)
        channel.send((0, "suggest_float", (), {}))  # the old untagged form
        with pytest.raises(messages.RequestRejected, match="not a tagged message"):
            messages.reply_to(channel.recv(), (messages.Ok,))
    finally:
        service.close()


def test_records_round_trip_through_the_wire():
    record = ProcessRecord.of(os.getpid(), "rank", socket.gethostname())
    sent = [
        messages.ProcessStarted(record),
        messages.RankExit(-9, ["last line"]),
        messages.KvGet("key", 2.5),
        messages.CheckpointLatest(),
        TrialCall(3, "report", (0.5, 1), {}),
    ]
    expected = (*messages.SUPERVISOR_REPORTS, *messages.RANK_REQUESTS, TrialCall)
    for message in sent:
        assert messages.decode(messages.encode(message), expected) == message
