"""`sparkdist.report`: training code on any rank sends metrics to the driver.

    def main(epochs):
        for epoch in range(epochs):
            loss = train_one_epoch()
            sparkdist.report({"loss": loss}, step=epoch)

Like `ray.train.report`: the metrics travel over the job's authenticated channel, and
the driver shows them (a progress line), logs rank 0's as MLflow step metrics into its
active run, keeps the last values on `runner.last_job.metrics`, and in a distributed
`sparkdist.tune` trial feeds the pruner: when it says prune, `report` raises
`optuna.TrialPruned`, which ends the trial's ranks.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Mapping
from typing import Any

from sparkdist.protocol import driver_channel, messages, rank_trace

logger = logging.getLogger(__name__)

PRUNE = "prune"
"""The driver's answer to a report when the job's tune trial was pruned."""

_next_step = 0


def report(metrics: Mapping[str, Any], step: int | None = None) -> None:
    """Send `metrics` (names to numbers) at `step` to the driver.

    `step` defaults to how many reports this rank sent before (0, 1, 2, ...). Values
    may be Python or numpy numbers or one-element tensors. Outside a sparkdist rank the
    metrics are logged on the `sparkdist` logger instead.

    Raises `optuna.TrialPruned` inside a pruned `sparkdist.tune` trial.
    """
    global _next_step
    values = _numbers(metrics)
    if step is None:
        step = _next_step
    elif isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    step = int(step)
    _next_step = step + 1
    client = driver_channel.driver_client()
    if client is None:
        logger.info("report step %d: %s", step, format_metrics(values))
        return
    rank_trace.step("report", step)
    reply = client.request(messages.Report(step, values))
    driver_channel.tell_if_due()
    if isinstance(reply, messages.Failed):
        raise ValueError(f"the driver refused the report: {reply.error}")
    if reply.value == PRUNE:
        import optuna

        raise optuna.TrialPruned(f"pruned at step {step} by the study's pruner")


def format_metrics(metrics: Mapping[str, float]) -> str:
    """`loss=0.125 acc=0.9`: metrics as one short line."""
    return " ".join(f"{name}={value:.4g}" for name, value in metrics.items())


def _numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    if not isinstance(metrics, Mapping) or not metrics:
        raise ValueError(f"metrics must be a non-empty dict of name -> number, got {metrics!r}")
    values = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"metric names must be non-empty strings, got {name!r}")
        try:
            values[name] = float(value.item() if hasattr(value, "item") else value)
        except (TypeError, ValueError):
            raise ValueError(
                f"metric {name!r} must be a number (int, float, numpy scalar or one-element "
                f"tensor), got {type(value).__name__}"
            ) from None
    return values
