"""The driver's trial service: the one server of a search, on `protocol.wire`
channels authenticated with the search's secret. It answers

* remote trials' calls (`TrialCall`), carried out by the search's `Ledger`;
* single-node workers asking for their next trial (`AskTrial`) and reporting its end
  (`TrialDone`); a worker whose channel closes while it holds a trial (its task was
  lost) has that trial recorded failed;
* requests for values shared with `sparkdist.tune.share` (`FetchShared`);
* each worker's watch channel (`WatchWorker`), closed by `stop_workers` to make the
  workers end their processes at once.
"""

from __future__ import annotations

import logging
import threading

import optuna

from sparkdist.protocol import messages, wire
from sparkdist.tune.ledger import Ledger
from sparkdist.tune.messages import (
    AskTrial,
    FetchShared,
    NoMoreTrials,
    RunTrial,
    TrialCall,
    TrialDone,
    WatchWorker,
)
from sparkdist.tune.outcome import Outcome
from sparkdist.tune.remote_trial import RemoteTrial
from sparkdist.tune.shared import blob_for

logger = logging.getLogger(__name__)

REQUESTS = (TrialCall, AskTrial, TrialDone, FetchShared, WatchWorker)
LOST = (
    "the Spark task running this trial ended before the trial did (a lost executor or "
    "a killed Python worker)"
)


class TrialService:
    """Serves the workers, remote trials and shared values of one search."""

    def __init__(self, bind_host: str, advertise_host: str, ledger: Ledger | None = None):
        self.ledger = ledger
        """The search served; None: refuse every request (no search runs)."""
        self._secret = wire.new_secret()
        self._watches: set[wire.Channel] = set()
        self._watches_lock = threading.Lock()
        self._server = wire.Server(self._secret, self._serve, host=bind_host, name="sparkdist-tune")
        self.address = (advertise_host, self._server.address[1])

    @property
    def secret(self) -> wire.JobSecret:
        """The search's secret for the workers' channels (no private key: they only connect)."""
        return self._secret.for_clients()

    def remote_trial(self, trial: optuna.Trial) -> RemoteTrial:
        """The proxy a running trial's objective gets."""
        return RemoteTrial(self.address, self.secret, trial.number, trial.params)

    def _serve(self, channel: wire.Channel) -> None:
        held = None  # the trial this channel's worker runs, if it is a worker
        try:
            while True:
                raw = channel.recv()
                try:
                    request = messages.decode(raw, REQUESTS)
                except messages.MalformedMessage as exc:
                    logger.warning("sparkdist.tune: refused a request: %s", exc)
                    channel.send(messages.encode(messages.Rejected(str(exc))))
                    continue
                if self.ledger is None:
                    channel.send(messages.encode(messages.Rejected("no search is running")))
                    continue
                if isinstance(request, WatchWorker):
                    with self._watches_lock:
                        self._watches.add(channel)
                    continue  # never answered: the next recv ends when the worker does
                if isinstance(request, AskTrial):
                    trial = self.ledger.next_trial()
                    if trial is None:
                        reply = NoMoreTrials("the search starts no more trials")
                    else:
                        held = trial.number
                        reply = RunTrial(trial.number, trial.params)
                elif isinstance(request, TrialDone):
                    reply = self._done(request)
                    held = None
                else:
                    reply = self._answer(request)
                channel.send(messages.encode(reply))
        finally:
            with self._watches_lock:
                self._watches.discard(channel)
            if held is not None:
                self.ledger.lose(held, LOST)

    def _done(self, request: TrialDone):
        if not isinstance(request.outcome, Outcome):
            return messages.Rejected("trial_done: outcome must be an Outcome")
        self.ledger.finish(request.number, request.outcome)
        return messages.Ok()

    def _answer(self, request):
        try:
            if isinstance(request, FetchShared):
                return messages.Ok(blob_for(request.key))
            return messages.Ok(
                self.ledger.call(request.number, request.op, request.args, request.kwargs)
            )
        except Exception as exc:  # noqa: BLE001 - raised again in the objective
            return messages.Failed(exc)

    def stop_workers(self) -> None:
        """Close every worker's watch channel: each kills its own process."""
        with self._watches_lock:
            watches, self._watches = list(self._watches), set()
        for channel in watches:
            channel.close()

    def close(self) -> None:
        self.stop_workers()
        self._server.close()
