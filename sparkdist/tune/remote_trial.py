"""The trial an objective gets wherever it runs: an Optuna-compatible proxy whose every
call goes to the real `optuna.Trial` held by the driver (see `service.py`).

Optuna samples define-by-run, inside the objective, so a suggestion can only be made by
the driver's study while the objective runs. A single-node worker makes one for each
trial it is given; a distributed trial's proxy is pickled into the runner's payload
(never on a command line). It connects (HMAC-authenticated with the search's secret) on
first use.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from sparkdist.protocol import messages, wire
from sparkdist.tune.messages import TrialCall

_REPLIES = (messages.Ok, messages.Failed)


class RemoteTrial:
    """`suggest_*`, `report`, `should_prune`, `set_user_attr` of the driver's trial.

    Every rank of a distributed trial gets the same suggestions (the driver's trial
    returns a parameter's value again when it is suggested again); only rank 0's
    `report` counts, as only rank 0's return value does.
    """

    def __init__(self, address: tuple[str, int], secret: wire.JobSecret, number: int, params: dict):
        self._address = address
        self._secret = secret
        self.number = number
        self._params = dict(params)
        self._channel: wire.Channel | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_channel"] = None
        return state

    def __repr__(self) -> str:
        return f"RemoteTrial(number={self.number}, params={self._params})"

    @property
    def params(self) -> dict[str, Any]:
        return dict(self._params)

    @property
    def rank(self) -> int:
        return int(os.environ.get("RANK", "0"))

    def _call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        if self._channel is None:
            self._channel = wire.connect(self._address, self._secret)
        call = TrialCall(self.number, op, args, kwargs)
        reply = messages.reply_to(self._channel.request(messages.encode(call)), _REPLIES)
        if isinstance(reply, messages.Failed):
            raise reply.error
        return reply.value

    def _suggest(self, op: str, name: str, *args: Any, **kwargs: Any) -> Any:
        value = self._call(op, name, *args, **kwargs)
        self._params[name] = value
        return value

    def suggest_float(
        self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False
    ) -> float:
        return self._suggest("suggest_float", name, low, high, step=step, log=log)

    def suggest_int(
        self, name: str, low: int, high: int, *, step: int = 1, log: bool = False
    ) -> int:
        return self._suggest("suggest_int", name, low, high, step=step, log=log)

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        return self._suggest("suggest_categorical", name, list(choices))

    def suggest_uniform(self, name: str, low: float, high: float) -> float:
        return self.suggest_float(name, low, high)

    def suggest_loguniform(self, name: str, low: float, high: float) -> float:
        return self.suggest_float(name, low, high, log=True)

    def suggest_discrete_uniform(self, name: str, low: float, high: float, q: float) -> float:
        return self.suggest_float(name, low, high, step=q)

    def report(self, value: float, step: int) -> None:
        """Send an intermediate value to the driver's pruner (rank 0's only)."""
        if self.rank == 0:
            self._call("report", float(value), int(step))

    def should_prune(self) -> bool:
        """The driver's pruner's answer for this trial's last reported step."""
        return bool(self._call("should_prune"))

    def set_user_attr(self, key: str, value: Any) -> None:
        self._call("set_user_attr", key, value)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
