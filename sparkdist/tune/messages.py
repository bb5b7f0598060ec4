"""The messages of tune's channels, to the driver's trial service:

* a remote trial calls the driver's `optuna.Trial` (`TrialCall`);
* a single-node worker (a long-lived Spark task) asks for its next trial (`AskTrial`,
  answered `RunTrial` or `NoMoreTrials`) and reports each outcome (`TrialDone`), and
  holds a second channel (`WatchWorker`) whose end tells it to stop at once;
* a trial reads a value shared with `sparkdist.tune.share` (`FetchShared`).

Registered on the runner's message protocol (`protocol.messages.register`), so
they travel on the same authenticated channels and are checked the same way.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from sparkdist.protocol.messages import register


@register("trial_call")
class TrialCall(NamedTuple):
    """A call of an `optuna.Trial` method, answered by `Ok(value)` or `Failed(error)`."""

    number: int
    op: str
    args: tuple
    kwargs: dict


@register("ask_trial")
class AskTrial(NamedTuple):
    """A worker is free: answered by `RunTrial` or `NoMoreTrials`."""

    worker: int
    pid: int


@register("run_trial")
class RunTrial(NamedTuple):
    """The trial the worker runs next (its parameters so far: enqueued ones)."""

    number: int
    params: dict


@register("no_more_trials")
class NoMoreTrials(NamedTuple):
    """The search starts no more trials; the worker's task ends."""

    reason: str


@register("trial_done")
class TrialDone(NamedTuple):
    """A worker's trial ended with `outcome` (a `tune.outcome.Outcome`); answered `Ok()`."""

    number: int
    outcome: Any


@register("watch_worker")
class WatchWorker(NamedTuple):
    """A worker's second channel, never answered: when the driver closes it (the search
    is cancelled) or its process ends, the worker kills its own process."""

    worker: int


@register("fetch_shared")
class FetchShared(NamedTuple):
    """The pickled value of a `share` handle, answered `Ok(bytes)` or `Failed(error)`."""

    key: str
