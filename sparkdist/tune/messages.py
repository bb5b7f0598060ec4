"""The messages of tune's channel: a remote trial calls the driver's trial service.

Registered on the runner's message protocol (`runner.protocol.messages.register`), so
they travel on the same authenticated channels and are checked the same way.
"""

from __future__ import annotations

from typing import NamedTuple

from sparkdist.runner.protocol.messages import register


@register("trial_call")
class TrialCall(NamedTuple):
    """A call of an `optuna.Trial` method, answered by `Ok(value)` or `Failed(error)`."""

    number: int
    op: str
    args: tuple
    kwargs: dict
