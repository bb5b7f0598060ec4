"""The driver's trial service: carries out the calls of remote trials on the real
`optuna.Trial` objects of the study, over `sparkdist.runner.protocol.wire` channels authenticated
with the search's secret."""

from __future__ import annotations

import logging
import threading
from typing import Any

import optuna

from sparkdist.runner.protocol import messages, wire
from sparkdist.tune.messages import TrialCall
from sparkdist.tune.remote_trial import RemoteTrial

logger = logging.getLogger(__name__)

_OPS = frozenset(
    {
        "suggest_float",
        "suggest_int",
        "suggest_categorical",
        "report",
        "should_prune",
        "set_user_attr",
    }
)


class TrialService:
    """Serves every running trial of one search; one lock keeps the study's calls in order."""

    def __init__(self, bind_host: str, advertise_host: str):
        self._secret = wire.new_secret()
        self._trials: dict[int, optuna.Trial] = {}
        self._pruned: set[int] = set()
        self._lock = threading.Lock()
        self._server = wire.Server(self._secret, self._serve, host=bind_host, name="sparkdist-tune")
        self.address = (advertise_host, self._server.address[1])

    def add(self, trial: optuna.Trial) -> RemoteTrial:
        """Accept calls for `trial`; return the proxy its objective gets."""
        with self._lock:
            self._trials[trial.number] = trial
        return RemoteTrial(self.address, self._secret, trial.number, trial.params)

    def remove(self, number: int) -> None:
        """Refuse further calls for a finished trial."""
        with self._lock:
            self._trials.pop(number, None)

    def was_pruned(self, number: int) -> bool:
        """Whether the pruner told this trial to stop."""
        with self._lock:
            return number in self._pruned

    def _serve(self, channel: wire.Channel) -> None:
        while True:
            raw = channel.recv()
            try:
                reply = self._call(messages.decode(raw, (TrialCall,)))
            except messages.MalformedMessage as exc:
                logger.warning("sparkdist.tune: refused a request: %s", exc)
                reply = messages.Rejected(str(exc))
            channel.send(messages.encode(reply))

    def _call(self, call: TrialCall) -> Any:
        number, op = call.number, call.op
        with self._lock:
            trial = self._trials.get(number)
            if trial is None or op not in _OPS:
                what = f"trial {number} is not running" if trial is None else f"no call {op!r}"
                return messages.Failed(RuntimeError(f"sparkdist.tune: {what}"))
            try:
                value = getattr(trial, op)(*call.args, **call.kwargs)
            except Exception as exc:  # noqa: BLE001 - raised again in the objective
                return messages.Failed(exc)
            if op == "should_prune" and value:
                self._pruned.add(number)
            return messages.Ok(value)

    def close(self) -> None:
        self._server.close()
