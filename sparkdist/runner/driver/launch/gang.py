"""An elastic job's gang: the plain Spark tasks that check in, and the world formed
from them.

Why: a barrier stage needs all its slots at once and Spark refuses it under dynamic
allocation (SPARK-24942). An elastic attempt instead submits `max` plain tasks; each
that Spark runs checks in here and waits. The gang seats the first ones (at least
`min`; as many as arrive until none has for `settle_s`; at most `max`) and keeps later
ones standing by: they hold slots the job can grow into, and the tasks Spark has not
started yet are what makes dynamic allocation ask for executors. When the attempt ends,
every task still waiting is released and ends, freeing its slot. An in-process elastic
world seats them into the running attempt instead (`seat_standing`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sparkdist import progress
from sparkdist.errors import JobFailedError, NotEnoughSlotsError
from sparkdist.network import join_address
from sparkdist.protocol import messages, wire

logger = logging.getLogger(__name__)

START_SETTLE_S = 2.0
"""Once `min` tasks are in: how long without a new arrival before the world forms."""


@dataclass
class _Arrival:
    check_in: messages.GangCheckIn
    channel: wire.Channel
    at: float
    decision: tuple | None = None
    decided: threading.Event = field(default_factory=threading.Event)
    gone: bool = False
    seated_as: int | None = None
    """The task index a world's first seating gave it (`Gang.seat`)."""


class Gang:
    """One attempt's check-ins, served on their own authenticated port."""

    def __init__(
        self,
        secret: wire.JobSecret,
        bind: str,
        advertise: str,
        leaving: Callable[[int], bool] | None = None,
    ):
        self._leaving = leaving
        """Whether a Spark task attempt runs on an executor being decommissioned: such a
        task is released, never seated (Spark starts no new task there, but one may have
        checked in before the notice)."""
        self._cond = threading.Condition()
        self._waiting: list[_Arrival] = []
        self._closed = False
        self._failed: str | None = None
        self.room: Callable[[], int] | None = None
        """Once the world is seated: how many more tasks it can take (its `max_np` less
        its members and newcomers). A task that checks in beyond that is released at once,
        so that a task Spark ran again beside the one submitted in its place holds no slot."""
        self.closed_seat: Callable[[int, str], None] | None = None
        """Told (task index, host) when a task the world was seated with closes its
        check-in connection: at its end, or when its executor was lost, maybe before it
        reached the job's service."""
        self._server = wire.Server(secret, self._serve, host=bind, name="sparkdist-gang")
        self.address = join_address(advertise, self._server.address[1])

    def _serve(self, channel: wire.Channel) -> None:
        try:
            check_in = messages.decode(channel.recv(), (messages.GangCheckIn,))
        except messages.MalformedMessage as exc:
            channel.send(messages.encode(messages.Rejected(str(exc))))
            return
        arrival = _Arrival(check_in, channel, time.monotonic())
        room = self.room() if self.room is not None else None
        with self._cond:
            if self._closed:
                arrival.decision = messages.encode(messages.GangRelease("the job is over"))
                arrival.decided.set()
            elif room is not None and len(self._waiting) >= room:
                full = messages.GangRelease("the world has no room for more tasks (max_np)")
                arrival.decision = messages.encode(full)
                arrival.decided.set()
            else:
                self._waiting.append(arrival)
                self._cond.notify_all()
        threading.Thread(target=self._watch, args=(arrival,), daemon=True).start()
        arrival.decided.wait()
        try:
            channel.send(arrival.decision)
            if arrival.decision[0] == messages.GangSeat.tag:
                # Held open until the task ends, or its executor is lost.
                channel.recv()
        except (EOFError, OSError):
            pass
        if arrival.seated_as is not None and self.closed_seat is not None:
            self.closed_seat(arrival.seated_as, arrival.check_in.host)

    def _watch(self, arrival: _Arrival) -> None:
        """A task that waits sends nothing: its connection closing means it is gone."""
        if arrival.decided.is_set():
            return
        arrival.channel.wait_readable()
        with self._cond:
            if not arrival.decided.is_set():
                arrival.gone = True
                if arrival in self._waiting:
                    self._waiting.remove(arrival)
                self._cond.notify_all()

    def form(self, low: int, high: int, timeout_s: float, min_np: int, max_np: int) -> list:
        """Wait for at least `low` tasks (up to `timeout_s`), then for more until none
        arrives for START_SETTLE_S or `high` are in; return the chosen, in arrival order."""
        deadline = time.monotonic() + timeout_s
        shown = None  # a progress display, once the wait is more than a moment
        with self._cond:
            try:
                while len(self._waiting) < low:
                    if self._failed is not None:
                        raise JobFailedError(self._failed)
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise NotEnoughSlotsError(
                            f"only {len(self._waiting)} of the {low} task slots that min_np="
                            f"{min_np} ranks need became free within {timeout_s:.0f}s "
                            f"(max_np={max_np}); the job was stopped. Give the cluster more "
                            "executors, or lower min_np."
                        )
                    self._cond.wait(min(remaining, 0.5))
                    shown = shown or progress.bar(
                        low, "sparkdist: waiting for task slots", unit="slots"
                    )
                    shown.set(len(self._waiting))
            finally:
                if shown is not None:
                    shown.close()
            while len(self._waiting) < high:
                quiet = time.monotonic() - max(a.at for a in self._waiting)
                if quiet >= START_SETTLE_S:
                    break
                self._cond.wait(START_SETTLE_S - quiet)
            if self._release_leaving() and len(self._waiting) < low:
                return self.form(low, high, deadline - time.monotonic(), min_np, max_np)
            return list(self._waiting[:high])

    def fail(self, reason: str) -> None:
        """The tasks' Spark job failed before the world formed: stop waiting for them."""
        with self._cond:
            self._failed = reason
            self._cond.notify_all()

    def seat(self, chosen: list, num_ranks: int, driver: str) -> None:
        """Seat `chosen` as tasks 0..n-1 of the world, whose service is `driver`."""
        with self._cond:
            for index, arrival in enumerate(chosen):
                arrival.seated_as = index
                self._seat(arrival, messages.GangSeat(index, len(chosen), num_ranks, driver))

    def seat_standing(
        self, most: int, first: int, per_task: int, driver: str, before: Callable[[list[int]], None]
    ) -> int:
        """Seat up to `most` of the tasks standing by into the running world, as tasks
        `first`, `first + 1`...; `before(their indexes)` runs before they hear of it.
        Returns how many were seated."""
        with self._cond:
            self._release_leaving()
            chosen = self._waiting[: max(0, most)]
            if not chosen:
                return 0
            indexes = list(range(first, first + len(chosen)))
            before(indexes)
            num_tasks = first + len(chosen)
            for index, arrival in zip(indexes, chosen, strict=True):
                self._seat(
                    arrival, messages.GangSeat(index, num_tasks, num_tasks * per_task, driver)
                )
            return len(chosen)

    def _release_leaving(self) -> int:
        """Release the waiting tasks whose executor is being decommissioned; how many."""
        if self._leaving is None:
            return 0
        going = [a for a in self._waiting if self._leaving(a.check_in.spark_task_id)]
        for arrival in going:
            self._waiting.remove(arrival)
            arrival.decision = messages.encode(
                messages.GangRelease("its executor is being decommissioned")
            )
            arrival.decided.set()
        if going:
            logger.info("released %d task(s) on executors being decommissioned", len(going))
        return len(going)

    def _seat(self, arrival: _Arrival, seat: messages.GangSeat) -> None:
        """Give `arrival` its seat. A task chosen by `form` may have gone between `form`
        and its seating (its connection closed: `_watch` took it off the waiting list);
        it is seated all the same, and its closed seat (`closed_seat`) then tells the
        world it was lost, as for a task lost just after its seat."""
        if arrival in self._waiting:
            self._waiting.remove(arrival)
        arrival.decision = messages.encode(seat)
        arrival.decided.set()

    def standing_by(self) -> int:
        """How many tasks wait with a free slot for the job to grow into."""
        with self._cond:
            self._release_leaving()
            return len(self._waiting)

    def close(self) -> None:
        """Release every task still waiting; later check-ins are released at once."""
        with self._cond:
            self._closed = True
            waiting, self._waiting = self._waiting, []
            for arrival in waiting:
                arrival.decision = messages.encode(messages.GangRelease("the attempt is over"))
                arrival.decided.set()
        self._server.close()
