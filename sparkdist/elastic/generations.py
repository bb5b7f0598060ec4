"""Which world a rank is in: the generations the driver forms, and the watcher that learns
of a newer one while training runs.

The driver numbers every world it forms (a generation) and answers `ElasticWorld` with the
first one newer than the rank's. A rank asks once on entry (`after=-1`), then its watcher
thread looks (`timeout_s=0`, cheap) every `POLL_S` so that `State.commit()` can stop at the
next commit; after a failure the training thread waits for the next one itself.
"""

from __future__ import annotations

import logging
import threading
import time

from sparkdist.protocol import messages
from sparkdist.protocol.driver_channel import DriverClient
from sparkdist.protocol.messages import Generation

logger = logging.getLogger(__name__)

POLL_S = 0.25
"""How often the watcher asks the driver whether a newer generation formed."""
WAIT_STEP_S = 5.0
"""One wait for the next generation (repeated until `wait_limit_s`)."""


class WorldChanged(Exception):
    """Raised by `State.commit()` (after committing) when the driver formed a newer world:
    `elastic.run` re-forms the group and calls the function again with no rollback.
    Horovod's `HostsUpdatedInterrupt`."""


class WorldStuck(RuntimeError):
    """Raised by `elastic.run` when its world broke and re-formed of the same members more
    than `SPARKDIST_ELASTIC_REFORM_LIMIT` times in a row with no commit between: a fault
    that recurs at the same step (a defect, a rank that always hangs there) would else
    re-form the world forever. Horovod's `reset_limit`, counting only re-forms that made
    no progress."""


class WorldEnded(Exception):
    """The job is stopping: no further generation will form."""


class Generations:
    """The driver's answers about generations, for one rank (its launch rank)."""

    def __init__(self, client: DriverClient, launch_rank: int):
        self.client, self.launch_rank = client, launch_rank

    def first(self, timeout_s: float) -> Generation:
        """The generation to join (it includes this rank, unless it was left out)."""
        found = self.newer(-1, timeout_s)
        if found is None:
            raise TimeoutError(
                f"the driver formed no world for rank {self.launch_rank} within {timeout_s:.0f} s"
            )
        return found

    def newer(self, after: int, timeout_s: float, broke: bool = False) -> Generation | None:
        """The newest generation after `after`, waiting up to `timeout_s` for one; None if
        none formed (`broke`: generation `after` broke under this rank). Raises
        `WorldEnded` when the job stops."""
        found = self._ask(after, timeout_s, broke=broke)
        while found is not None:  # a later one may be formed already
            later = self._ask(found.number, 0.0)
            if later is None:
                break
            found = later
        return found

    def wait_next(self, after: int, limit_s: float, broke: bool = False) -> Generation:
        """The next generation after `after`: waits in steps of `WAIT_STEP_S` up to `limit_s`.
        `broke`: a collective of `after` failed here; the driver, told so by every member
        of a world that lost nobody, forms the next of them all (nobody else would)."""
        deadline = time.monotonic() + limit_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"no world formed after generation {after} within {limit_s:.0f} s"
                )
            found = self.newer(after, min(WAIT_STEP_S, left), broke)
            if found is not None:
                return found

    def finish(self, number: int) -> Generation | None:
        """This rank's function returned in generation `number`: a newer one that includes
        the rank (formed meanwhile: run again there), or None (done; also when the job
        stops)."""
        try:
            return self._ask(number, 0.0, done=True)
        except WorldEnded:
            return None

    def _ask(
        self, after: int, timeout_s: float, done: bool = False, broke: bool = False
    ) -> Generation | None:
        reply = self.client.request(
            messages.ElasticWorld(self.launch_rank, after, float(timeout_s), done, broke)
        )
        if isinstance(reply, messages.Missing):
            return None
        if isinstance(reply, messages.Failed):
            raise WorldEnded(f"the job is stopping: {reply.error}")
        if not isinstance(reply.value, Generation):
            raise messages.MalformedMessage(f"not a generation: {reply.value!r}")
        return reply.value


class Watcher:
    """A thread that looks for a generation newer than the current one every `POLL_S`.

    `on_newer(generation)` runs in the watcher's thread when one appears (the group uses it
    to abort NCCL communicators a lost peer would block forever)."""

    def __init__(self, generations: Generations, current: Generation, on_newer=None):
        self._generations, self._current, self._on_newer = generations, current, on_newer
        self._newer: Generation | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="sparkdist-elastic-watcher", daemon=True
        )

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def newer(self) -> Generation | None:
        """The newer generation seen, if any."""
        return self._newer

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                found = self._generations.newer(self._current.number, 0.0)
            except WorldEnded:
                return
            except (OSError, messages.RequestRejected) as exc:
                logger.debug("elastic watcher: %s", exc)
                return
            if found is not None:
                self._newer = found
                logger.info("elastic: generation %d formed (%s)", found.number, found.reason)
                if self._on_newer is not None:
                    self._on_newer(found)
                return
