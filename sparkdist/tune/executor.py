"""The trial executor: what every kind of trial execution shares.

A search hands its trials to one executor: `SingleNodeTrials` (one Spark job of
long-lived worker tasks pulling trials) or `DistributedTrials` (one runner job per
trial). Both hold the same state (the cluster, the objective, the trial service, the
ledger, how many trials run at once) and run the same loop: start what can start, wait
a moment for something to end, let the ledger fail the search if too many trials
failed, until nothing runs. A kind says only how it starts, waits, cancels and closes.
"""

from __future__ import annotations

from sparkdist.protocol import payload
from sparkdist.tune.ledger import Ledger
from sparkdist.tune.service import TrialService

CANCEL_WAIT_S = 120.0


class TrialExecutor:
    """Runs a search's trials, `at_once` at a time, until the search starts no more."""

    poll_s = 0.5
    """The longest `wait` between two checks of the ledger."""

    def __init__(self, cluster, objective, service: TrialService, ledger: Ledger, at_once: int):
        # Pickled now, on the driver's main thread: an objective that cannot travel fails
        # the search at once with the name of the culprit (`PayloadError`).
        payload.pack(objective, {})
        self.cluster = cluster
        self.objective = objective
        self.service = service
        self.ledger = ledger
        self.at_once = at_once

    def run(self) -> None:
        """Start trials while the search wants them; return once none runs."""
        try:
            while self.start():
                self.wait(self.poll_s)
                self.ledger.check_failures()
        finally:
            self.close()

    def start(self) -> bool:
        """Start what can start now; True while anything runs."""
        raise NotImplementedError

    def wait(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for something to end, and record what ended."""
        raise NotImplementedError

    def cancel(self) -> None:
        """Cancel what runs and wait for it to end."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what `run` held (called once the loop ends, also on an error)."""
