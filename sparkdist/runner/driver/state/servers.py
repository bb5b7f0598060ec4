"""A parameter-server job's server ranks (`roles.SERVERS`: its workers and parameter
servers). They run a TensorFlow server that never returns, so the driver tells their
supervisors to finish once the chief returned, including a supervisor that connects
after that."""

from __future__ import annotations

from sparkdist.protocol import messages, wire
from sparkdist.runner.driver.state import peers
from sparkdist.runner.driver.state.peers import Peers
from sparkdist.runner.driver.state.ranks import RankRecords
from sparkdist.runner.driver.state.spec import JobSpec


class ParameterServers:
    """Which peers are a parameter-server job's servers, and when to stop them."""

    def __init__(self, job: JobSpec, ranks: RankRecords, peers: Peers):
        self._job = job
        self._ranks = ranks
        self._peers = peers

    def needs_result(self, rank: int) -> bool:
        """Whether the job waits for `rank`'s result: servers send none."""
        return not self._job.server_rank(rank)

    def chief_done(self) -> bool:
        """A parameter-server job's chief returned: its servers are to stop."""
        with self._ranks.cond:
            return self._job.roles is not None and self._ranks.by_rank[0].has_result

    def late(self, kind: str, number: int) -> bool:
        """Whether a peer connecting now is a server whose chief is done already."""
        return self.chief_done() and self._server_peer(kind, number)

    def channels(self) -> list[wire.Channel]:
        """The channels of the servers' supervisors connected now."""
        return self._peers.select(self._server_peer)

    def finish(self, channels: list[wire.Channel]) -> None:
        """The chief is done: its servers (which never return) are stopped."""
        peers.send(channels, messages.Finish("the chief finished"))

    def _server_peer(self, kind: str, number: int) -> bool:
        return kind == "supervisor" and self._job.server_rank(number)
