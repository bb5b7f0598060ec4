"""What one trial ended with, whichever way it ran."""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

COMPLETE, PRUNED, FAILED = "complete", "pruned", "failed"


@dataclass
class Outcome:
    state: str
    value: Any = None
    traceback: str | None = None


def run_objective(objective, trial) -> Outcome:
    """Call the objective where the trial runs; an exception becomes the trial's outcome
    (so Spark does not retry a failing objective), `TrialPruned` a pruned one."""
    import optuna

    try:
        return Outcome(COMPLETE, objective(trial))
    except optuna.TrialPruned:
        return Outcome(PRUNED)
    except Exception:  # noqa: BLE001 - reported as the trial's failure
        return Outcome(FAILED, traceback=traceback.format_exc())
    finally:
        trial.close()
