"""An in-process elastic world's membership (`sparkdist.elastic.run`, issue 40): which
launch ranks form the current generation of the world, which entered elastic code, which
left, and the ranks waiting for a newer generation (`messages.ElasticWorld`).

Generation 0 is the world the attempt formed: every launch rank, in order. A rank's
first `ElasticWorld(after=-1)` says it runs in-process elastic code ("entered"). Only
when every live member has entered, and the job allows it (an elastic job under the
direct launcher: `min_np` is set), is a lost rank a *pending loss* here instead of a
failure of the job; the driver's loop of attempts (`job.py`) then decides: re-form in
process (`shrink`) or relaunch as for any failure (`refuse`). A grow seats newcomers
(`seat`); the generation that includes them forms once every newcomer has entered.

Members are ordered: survivors keep their relative order, newcomers follow by launch
rank, so world rank 0 is a survivor whenever one exists (it broadcasts the state).
A rank that is no longer a member is answered with the newest generation, ends, and is
a tolerated leave (`left`). A world can also break with nobody lost: every member's
collective timed out (a host cut off for less than the driver's dead-peer detection, a
rank stuck for longer than the collective timeout); once every member says its world
broke (`broke`), the next generation forms of them all (`Breaks`).

A loss that leaves fewer than `min_np` members does not end the world at once (`Waits`):
the survivors keep their processes and wait, as Horovod elastic's do, for the slots of
the lost to come back (a grow seats the tasks that take them); the next generation forms
of the survivors and the newcomers once they are `min_np`, or the wait runs out and the
loop of attempts relaunches as for any failure (`refuse`).

Waiters are answered by callbacks, outside the lock (the service runs them on its loop,
as it does the rendezvous store's), with `Ok(generation)` or `Failed(why)` once the job
stops. Everything else runs under the job's lock (`JobState.cond`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sparkdist.protocol import messages
from sparkdist.protocol.messages import Generation
from sparkdist.runner.driver.records import RankRecords

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Loss:
    """A member lost while the world was in process, not yet decided on."""

    rank: int
    reason: str
    outside_user_code: bool


@dataclass
class Wait:
    """A world left below min_np in process, waiting for slots (`Waits`)."""

    since: float
    deadline: float
    losses: list[Loss] = field(default_factory=list)
    """The losses it went on without: failures after all if it runs out (`refuse`)."""
    counted: int = 0
    """The faults `max_failures` counted for it (`failures.RelaunchBudget.reform`)."""


Reply = Callable[[tuple], None]
"""How a waiting `ElasticWorld` is answered: `Ok(generation)` or `Failed(why)`."""


class Grows:
    """A grow of an in-process elastic world (`Membership`'s part): newcomers are seated,
    and the world that includes them forms once every one entered, but never with a
    member whose `elastic.run` returned (`done`): newcomers seated in a run's last moments
    would wait for a world whose members went on. A warm world's next run
    (`warm.WarmDispatch`) seats them again (`strayed` until then)."""

    def seat(self, newcomers: list[int], reason: str) -> None:
        """A grow seated tasks that run `newcomers` (fresh launch ranks): the next
        generation includes them once every one has entered."""
        with self.cond:
            self.joining.update(newcomers)
            self._grow_reason = reason

    def size(self) -> int:
        """Members and newcomers: the world's size once they are in."""
        with self.cond:
            return len(self.survivors()) + len(self.joining)

    def _form_grown(self) -> None:
        with self.cond:
            if not self.joining or not self.joining <= self.entered:
                return  # formed by another rank's request already
            if self.done & set(self.generation.members):
                return  # a member's run returned: its newcomers join the next run
            survivors, newcomers = self.survivors(), sorted(self.joining)
            if self.wait is not None and len(survivors) + len(newcomers) < (self.min_np or 0):
                return  # below min_np still: the survivors wait for more
            self.joining.clear()
            members = [*survivors, *newcomers]
            reason = f"{self._grow_reason}: ranks {newcomers} joined"
            wait, self.wait = self.wait, None
            if wait is not None:
                reason = f"{reason}, after {time.monotonic() - wait.since:.1f}s below min_np"
        self._form(members, reason, before=len(survivors) if wait is not None else None)

    def finish(self, rank: int, after: int) -> tuple | None:
        """Rank `rank`'s function returned in generation `after`: a newer generation that
        includes it (a grow formed as it returned: it runs again there), else None: it is
        done, and no grown world forms with it in this run (its newcomers would wait for it)."""
        with self.cond:
            if self.generation.number > after and rank in self.generation.members:
                return messages.Ok(self.generation)
            self.done.add(rank)
            return None

    def new_run(self) -> None:
        """A warm world's next run: its code says again that it is elastic, and its
        members may grow again."""
        with self.cond:
            self.entered.clear()
            self.done.clear()

    def end_run(self) -> None:
        """A warm run ended: newcomers seated too late to be in its world leave it (their
        `elastic.run` returns None); they join the next run's world."""
        with self.cond:
            self.strayed |= self.joining
            stray = [(r, a, reply) for r, a, reply in self._waiting if r in self.strayed]
            self._waiting = [waiting for waiting in self._waiting if waiting[0] not in self.strayed]
        for rank, after, reply in stray:
            reply(self._answer(rank, after) or messages.Missing(f"generation>{after}"))

    def took_run(self, rank: int) -> None:
        """Rank `rank` took a warm world's next run: a newcomer waits for its world again."""
        with self.cond:
            self.strayed.discard(rank)


class Breaks:
    """A world broken with no member known lost (`Membership`'s part, issue 64): each
    member whose collective failed goes back to its commit and says so as it waits for
    the next world. Nobody was lost, so no loss forms one: once every member said so,
    the next generation forms of the same members (a member cut off says so once it
    reaches the driver again). A member that never does is the stall watch's
    (`stalls.StallWatch`: stacks, then dropped as silent) or the dead-peer detection's
    (its task lost)."""

    def broke(self, rank: int, after: int) -> None:
        """Member `rank`'s world, generation `after`, broke under it."""
        with self.cond:
            current = self.generation
            if after != current.number or rank not in current.members:
                return  # a newer world formed already: the rank is answered with it
            if self._broken_in != after:
                self._broken_in, self._broken = after, set()
            self._broken.add(rank)
            if self.pending or self.leaving or not set(current.members) <= self._broken:
                return  # a loss (or a leave) forms the next world, or some are yet to say
            if self.wait is not None:
                return  # below min_np: the newcomers' arrival forms the next world
            members = list(current.members)
        reason = (
            f"world {after} broke with no member lost (every member's collective failed "
            "or timed out: a host cut off briefly, or a rank stuck longer than "
            "SPARKDIST_ELASTIC_TIMEOUT_S); the same members again"
        )
        self._form(members, reason)


class Waits:
    """A world left below min_np in process (`Membership`'s part, issue 64): the survivors
    keep their processes and wait for a world, as Horovod elastic's wait for hosts, while
    the slots of the lost come back (`launch/gang_kind.py`: `_SlotReturns` gives each back
    to Spark and submits a task in its place; a grow seats it). The next generation forms
    of the survivors and the newcomers once they are `min_np` (`Grows`); a wait that runs
    out is refused (`refuse`): the job relaunches from its checkpoint, as before."""

    def can_wait(self) -> bool:
        """Whether the survivors of the pending losses may wait for slots: some are left
        (world rank 0, who has the state, is one of them) and no wait ran out."""
        with self.cond:
            if self.min_np is None or not self.survivors():
                return False
            return self.wait is None or time.monotonic() < self.wait.deadline

    def hold(self, limit_s: float) -> None:
        """Go on without the pending losses (they become tolerated leaves, their slots
        come back) but form no world below min_np: the survivors wait for the newcomers
        a grow seats, until `limit_s` after the first loss of the wait (`waited_out`)."""
        with self.cond:
            losses = list(self.pending.values())
            before = len(self.survivors()) + len(losses)
            self.pending.clear()
            self.left.update((loss.rank, loss.reason) for loss in losses)
            now = time.monotonic()
            first = self.wait is None
            self.wait = self.wait or Wait(now, now + limit_s)
            self.wait.losses += losses
            self.wait.counted += 1
            size, left_s = len(self.survivors()), self.wait.deadline - now
        reason = "; ".join(loss.reason for loss in losses)
        why = (
            f"below min_np={self.min_np}: {'the survivors wait' if first else 'the wait goes on'} "
            f"up to {left_s:.0f}s (start_timeout) for slots to come back: {reason}"
        )
        logger.warning(
            "sparkdist elastic job: world %d -> %d ranks in process, %s", before, size, why
        )
        if self.on_wait is not None:
            self.on_wait(size, why)

    def waited_out(self) -> str | None:
        """Why the wait below min_np ran out, or None (no wait, or time is left)."""
        with self.cond:
            wait = self.wait
            if wait is None or time.monotonic() < wait.deadline:
                return None
            size = len(self.survivors()) + len(self.joining)
        return (
            f"the world stayed below min_np={self.min_np} ({size} ranks) for "
            f"{time.monotonic() - wait.since:.0f}s (start_timeout): no world re-formed in process"
        )


class Membership(Breaks, Grows, Waits):
    """The membership of one attempt's in-process elastic world (see the module)."""

    def __init__(self, cond: threading.Condition, ranks: RankRecords, min_np: int | None) -> None:
        self.cond, self._ranks, self.min_np = cond, ranks, min_np
        """The fewest members a re-formed world may have; None: never re-formed in
        process (a fixed-size job, or the mpi launcher, whose mpirun ends every rank)."""
        self.generation = Generation(0, tuple(ranks.by_rank), "start")
        self.entered: set[int] = set()
        """Launch ranks that asked for a world (they run in-process elastic code)."""
        self.left: dict[int, str] = {}
        """Launch ranks the world went on without (lost, or no longer members): why."""
        self.pending: dict[int, Loss] = {}
        """Members lost in process, for the driver's loop to decide on."""
        self.joining: set[int] = set()
        """Newcomers seated by a grow, not yet in a generation."""
        self.leaving: dict[int, str] = {}
        """Members to leave at their next commit (a decommission notice): why; for the
        driver's loop to form the generation without them (`let_leave`)."""
        self.done: set[int] = set()  # members whose `elastic.run` returned in this run
        self.strayed: set[int] = set()  # newcomers whose warm run ended before their world
        self._grow_reason = ""
        self._broken_in, self._broken = -1, set()  # members whose world broke, and its number
        self._waiting: list[tuple[int, int, Reply]] = []
        self._closed: str | None = None
        self.wait: Wait | None = None
        """The world is below min_np, its survivors waiting for slots (`Waits`)."""
        self.on_form: Callable[[Generation], None] | None = None  # the job's trace
        self.on_wait: Callable[[int, str], None] | None = None  # the job's trace

    # --- the ranks' requests -------------------------------------------------------------

    def ask(self, rank: int, after: int, reply: Reply | None) -> tuple | None:
        """Rank `rank` asks for a generation newer than `after`: the answer if there is
        one now (or the job is stopping); else None, and `reply` (if given: the rank
        waits) is called once there is."""
        with self.cond:
            if after < 0 and rank not in self.strayed:
                self.entered.add(rank)
            grown = bool(self.joining) and self.joining <= self.entered
        if grown:
            self._form_grown()
        with self.cond:
            answer = self._answer(rank, after)
            if answer is None and reply is not None:
                self._waiting.append((rank, after, reply))
        return answer

    def _answer(self, rank: int, after: int) -> tuple | None:
        if self._closed is not None:
            return messages.Failed(self._closed)
        if self.generation.number > after and (rank not in self.joining or rank in self.strayed):
            return messages.Ok(self.generation)
        return None

    # --- what the losses and the loop of attempts ask and decide ------------------------

    def in_process(self, lost: Iterable[int] = ()) -> bool:
        """Whether the world re-forms in process: the job allows it, and every member
        alive until now (the `lost` ones too) has entered in-process elastic code."""
        with self.cond:
            if self.min_np is None:
                return False
            lost, records = set(lost), self._ranks.by_rank
            alive = [r for r in self.survivors() if r in lost or not records[r].exited]
            return all(r in self.entered for r in alive)

    def lose(self, rank: int, reason: str, outside_user_code: bool) -> bool:
        """Rank `rank` was lost (killed, its supervisor or task gone). True when that is
        no failure of the job: it had left already, or the world is in process and the
        loss now waits for the loop's decision (`pending`)."""
        with self.cond:
            if rank in self.left or rank in self.pending:
                return True
            if rank in self.joining:  # a newcomer lost before it was in any world
                self.joining.discard(rank)
                self.left[rank] = reason
                return True
            if not self.in_process(lost=[rank]):
                return False
            self.pending[rank] = Loss(rank, reason, outside_user_code)
            self.cond.notify_all()
            return True

    def gone(self, rank: int) -> bool:
        """Whether the world went (or is to go) on without `rank`."""
        with self.cond:
            return rank in self.left or rank in self.pending

    def survivors(self) -> list[int]:
        """The members the world goes on with: not lost (pending), nor left while the
        world waits below min_np."""
        gone = self.pending.keys() | self.left.keys()
        return [r for r in self.generation.members if r not in gone]

    def can_shrink(self) -> bool:
        """Whether the members left after the pending losses are enough (min_np)."""
        return self.min_np is not None and len(self.survivors()) >= self.min_np

    def shrink(self) -> tuple[int, int, str]:
        """Form the next generation from the survivors of the pending losses (they
        become tolerated leaves); returns (size before, size after, why)."""
        with self.cond:
            losses = list(self.pending.values())
            self.pending.clear()
            for loss in losses:
                self.left[loss.rank] = loss.reason
            before = len(self.generation.members)
            reason = "; ".join(loss.reason for loss in losses)
            members = [r for r in self.generation.members if r not in self.left]
        self._form(members, reason)
        return before, len(members), reason

    def depart(self, ranks: list[int], reason: str) -> bool:
        """Members `ranks` are to leave (their executor is being decommissioned): False
        when the world cannot go on in process without them (too few, or not every
        member runs in-process elastic code)."""
        with self.cond:
            if not self.in_process():
                return False
            going = set(ranks) | self.leaving.keys()
            members = self.survivors()
            if self.min_np is None or len([r for r in members if r not in going]) < self.min_np:
                return False
            self.leaving.update((r, reason) for r in ranks if r in members)
            self.cond.notify_all()
            return True

    def let_leave(self) -> tuple[int, int, str]:
        """Form the next generation without the leaving members (they become tolerated
        leaves, and end at their next commit); returns (size before, size after, why)."""
        with self.cond:
            leaving, self.leaving = self.leaving, {}
            self.left.update(leaving)
            for rank in leaving:  # lost before it could leave: it has left all the same
                self.pending.pop(rank, None)
            before = len(self.generation.members)
            members = [r for r in self.generation.members if r not in self.left]
            reason = "; ".join(sorted(set(leaving.values())))
        self._form(members, f"{reason}: leaving at their next commit", planned=True)
        return before, len(members), reason

    def refuse(self) -> tuple[list[Loss], int]:
        """The loop will not re-form in process: the pending losses (and those a wait
        below min_np went on without) are failures after all, and the world is not
        re-formed in process any more. Also returns the faults the wait counted."""
        with self.cond:
            wait, self.wait = self.wait, None
            losses = [*(wait.losses if wait else []), *self.pending.values()]
            self.pending.clear()
            min_np, self.min_np = self.min_np, None
            size = len(self.survivors()) + len(self.joining)
        if wait is not None:
            logger.warning(
                "sparkdist elastic job: the wait below min_np=%s ends after %.0fs with %d "
                "ranks: its losses fail the attempt, which relaunches (or fails) as for any loss",
                min_np,
                time.monotonic() - wait.since,
                size,
            )
        return losses, wait.counted if wait else 0

    def close(self, reason: str) -> None:
        """The job stops: every waiting rank is answered `Failed`."""
        with self.cond:
            self._closed = reason
            waiting, self._waiting = self._waiting, []
        for _, _, reply in waiting:
            reply(messages.Failed(reason))

    # --- forming a generation --------------------------------------------------------------

    def _form(
        self, members: list[int], reason: str, planned: bool = False, before: int | None = None
    ) -> None:
        """Make `members` the next generation and answer every rank waiting for it
        (`before`: the world's size before it, if not the last generation's)."""
        with self.cond:
            before = len(self.generation.members) if before is None else before
            number = self.generation.number + 1
            self.generation = Generation(number, tuple(members), reason, planned)
            ready, still = [], []
            for rank, after, reply in self._waiting:
                answer = self._answer(rank, after)
                if answer is None:
                    still.append((rank, after, reply))
                else:
                    ready.append((reply, answer))
            self._waiting = still
            self.cond.notify_all()
        logger.warning(
            "sparkdist elastic job: world %d -> %d ranks in process: %s",
            before,
            len(members),
            reason,
        )
        if self.on_form is not None:
            self.on_form(self.generation)
        for reply, answer in ready:
            reply(answer)
