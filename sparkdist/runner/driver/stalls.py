"""A job that hangs or crawls says where each rank is.

* `StackRequests` (a part of `JobState`): the driver asks every running rank's
  supervisor for its rank's stacks (`DumpStacks`) and waits a bounded time for the
  answers (`RankStacks`).
* `SignsOfLife` (a part of `JobState`): when a rank last showed one (an output line, a
  `report()`, and the `Alive` counts of loader batches, elastic commits and checkpoint
  saves), and its step counts, for the straggler measure (`Stragglers`).
* `where`: ask, write each rank's full dump into its `rank-N.log` (and NCCL dumps beside
  them), and return the grouped stacks (`stacks.py`).
* `show_where`: when a job ends badly (its `timeout`, Ctrl-C, one rank failed while
  others run) the stacks go into the error, or are shown before the ranks are stopped.
* `StallWatch`: a thread per attempt: no sign of life for `stall_warning` seconds logs
  the stacks and goes on, for `stall_timeout` fails the job with them
  (`failures.FailureTracker.fail_now`); it also names stragglers. In an in-process
  elastic world (`stall_timeout` 60 s unless given) each member is watched alone: one
  silent that long is dropped if it holds the others back, stopped or stuck
  (`stacks.stopped`): it is killed, and lost as a killed rank is (`failures.Losses`),
  so the world re-forms without it. A look that singles nobody out is followed by
  another `relook_s` later, each silence still counted from its own last sign of life.
* `StallClock`: when each rank's silence starts to count: at its first sign of life;
  its start before that (imports, building a model) counts against `start_timeout`;
  and when the watch may look next.
* `Stragglers`: a rank that steps at least `RATIO` times slower than the median rank.
  Each rank's step rate comes from its signs of life that count steps: its data
  loader's batches (`Alive`) or its `report()` calls, whichever every measured rank has
  (batches first). A rank's rate is its steps over the last `WINDOW_S` seconds; once it
  has been `RATIO` times slower than the median for `SUSTAIN_S`, it is named once (host,
  its rate against the median), and again when it has kept up for as long. Pure and
  cheap: the stall watch calls `check` once a second.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable

from sparkdist.errors import JobFailedError, JobStalledError, JobTimeoutError, SparkdistError
from sparkdist.protocol import messages, stack_dumps
from sparkdist.runner.driver.console import spans
from sparkdist.runner.driver.records import Peers, RankRecords, send
from sparkdist.runner.driver.stacks import RankStacks, group, stopped

logger = logging.getLogger(__name__)

ELASTIC_STALL_TIMEOUT_S = 60.0
"""An in-process elastic job's `stall_timeout` when none is given: a member silent this
long while the others wait for it is dropped (the job itself never fails of it).

Twice the elastic collective timeout (`torch_group.DEFAULT_TIMEOUT_S`, 30 s): a member
that keeps the others waiting longer than that has broken their collective already, so a
silence to be tolerated must be shorter, and 60 s leaves room for what is silent on one
rank alone before a step of the others (a first step under torch.compile that ends at
other times on other ranks, an evaluation or a checkpoint written outside
`sparkdist.checkpoint`, whose writes are signs of life). A stopped rank then costs about
a minute (the 300 s of before cost five); the issue's 30 s at p99 per fault needs a
`stall_timeout` of about 20 s, given by a job whose steps are short and even."""
WAIT_S = stack_dumps.WAIT_S + 1.0
"""How long the driver waits for every rank's stacks (the supervisor waits `WAIT_S`)."""
TICK_S = 1.0
RELOOK_FRACTION = 0.25
RELOOK_MIN_S = 3.0
FULL_STACKS = "Each rank's full stacks are in its rank-N.log."
NCCL_COMMAND = "torchfrtrace {directory} --prefix " + stack_dumps.NCCL_PREFIX + " -j"
"""The one command that analyses the ranks' NCCL flight recorder dumps (torch's)."""


class StackRequests:
    """The driver's requests for its ranks' stacks, and their answers."""

    def __init__(self, cond: threading.Condition, peers: Peers, ranks: RankRecords):
        self.cond, self._peers, self._ranks = cond, peers, ranks
        self._next = 0
        self._answers: dict[int, dict[int, tuple[str, bytes]]] = {}

    def ask(
        self, wait_s: float = WAIT_S, nccl: bool = False
    ) -> tuple[dict[int, RankStacks], dict[int, bytes]]:
        """Every running rank's stacks (text "" for a rank that did not answer), and the
        NCCL dumps of those that sent one."""
        with self.cond:
            self._next += 1
            request = self._next
            answers = self._answers[request] = {}
            running = self._ranks.running()
            links = {r: self._peers.channel("supervisor", r) for r in running}
            asked = [r for r, link in links.items() if link is not None]
            if not asked:  # no supervisor reachable from here (a relayed job's client)
                del self._answers[request]
                return {}, {}
        send([links[r] for r in asked], messages.DumpStacks(request, nccl))
        deadline = time.monotonic() + wait_s * (2 if nccl else 1)
        by_rank = self._ranks.by_rank
        with self.cond:  # until each asked rank answered or ended (its answer may not come)
            while time.monotonic() < deadline and not all(
                r in answers or by_rank[r].exited for r in asked
            ):
                self.cond.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            del self._answers[request]
            hosts = {r: self._ranks.by_rank[r].host for r in running}
        stacks = {r: RankStacks(hosts[r], answers.get(r, ("", b""))[0]) for r in running}
        return stacks, {r: answer[1] for r, answer in answers.items() if answer[1]}

    def answered(self, rank: int, request: int, text: str, nccl: bytes) -> None:
        """Rank `rank`'s supervisor answered `request` (late answers are dropped)."""
        with self.cond:
            if request in self._answers:
                self._answers[request][rank] = (text, nccl)
                self.cond.notify_all()


WINDOW_S = 5.0
SUSTAIN_S = 3.0
RATIO = 1.5
KINDS = ("batches", "report")
"""The step counts measured, in order of preference."""


class Stragglers:
    """Each rank's step counts over time, and which ranks are named slow. The service's
    loop adds samples while the stall watch reads them: `_lock` keeps them apart."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: dict[tuple[int, str], deque[tuple[float, int]]] = {}
        self._slow_since: dict[int, float] = {}
        self._even_since: dict[int, float] = {}
        self.slow: dict[int, str] = {}
        """The ranks named slow now, and what was said of each."""
        self.notes: list[str] = []
        """Everything said, in order (`HorovodRunner.last_job.stragglers`)."""

    def progress(self, rank: int, kind: str, count: int, now: float) -> None:
        """Rank `rank` had made `count` steps of `kind` at `now` (seconds)."""
        with self._lock:
            samples = self._samples.setdefault((rank, kind), deque())
            samples.append((now, count))
            while len(samples) > 2 and samples[1][0] < now - 2 * WINDOW_S:
                samples.popleft()

    def rates(self, now: float) -> dict[int, float]:
        """Steps a second over the last `WINDOW_S`, of each rank measured that long."""
        with self._lock:
            measured = [(key, list(samples)) for key, samples in self._samples.items()]
        for kind in KINDS:
            rates = {}
            for (rank, of), samples in measured:
                if of == kind and samples[0][0] <= now - WINDOW_S:
                    then = max(c for t, c in samples if t <= now - WINDOW_S)
                    rates[rank] = (samples[-1][1] - then) / WINDOW_S
            if len(rates) >= 2:
                return rates
        return {}

    def check(self, now: float, ranks, gone: set[int] = frozenset()) -> list[str]:
        """What to say now: ranks that became slow, and ranks that recovered (`gone`:
        ranks no longer in the world, measured no more)."""
        rates = {r: v for r, v in self.rates(now).items() if not _ended(ranks, r) and r not in gone}
        for rank in gone & self.slow.keys():
            del self.slow[rank]
        if len(rates) < 2:
            return []
        median = statistics.median(rates.values())
        said = []
        for rank, rate in sorted(rates.items()):
            host = ranks.by_rank[rank].host if rank in ranks.by_rank else "?"
            if median > 0 and rate * RATIO <= median:
                self._even_since.pop(rank, None)
                since = self._slow_since.setdefault(rank, now)
                if rank not in self.slow and now - since >= SUSTAIN_S:
                    self.slow[rank] = (
                        f"rank {rank} (host {host}) is a straggler: {rate:.2f} steps/s against "
                        f"the median {median:.2f} ({_slower(median, rate)})"
                    )
                    said.append(self.slow[rank])
            else:
                self._slow_since.pop(rank, None)
                since = self._even_since.setdefault(rank, now)
                if rank in self.slow and now - since >= SUSTAIN_S:
                    del self.slow[rank]
                    said.append(
                        f"rank {rank} (host {host}) keeps up again: {rate:.2f} steps/s against "
                        f"the median {median:.2f}"
                    )
        self.notes += said
        return said


def _ended(ranks, rank: int) -> bool:
    """A rank that ended steps no more: it is no straggler, nor part of the median."""
    state = ranks.by_rank.get(rank)
    return state is not None and state.exited


def _slower(median: float, rate: float) -> str:
    return f"no step in {WINDOW_S:g}s" if rate <= 0 else f"{median / rate:.1f}x slower"


class SignsOfLife:
    """When the job's ranks last showed a sign of life, and each rank's step counts."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.by_rank: dict[int, float] = {}
        """When each rank last showed one (monotonic seconds)."""
        self.stragglers = Stragglers()

    def seen(self, rank: int, steps: int | None = None, kind: str = "") -> None:
        """A sign of life of `rank` (with its count of `kind` steps, where it has one)."""
        now = time.monotonic()
        self.last = self.by_rank[rank] = now
        if steps is not None:
            self.stragglers.progress(rank, kind, steps, now)

    def lasts(self, ranks: list[int], since: float) -> dict[int, float]:
        """Each of `ranks`' last sign of life no later than `since` (never heard: `since`)."""
        return {r: min(self.by_rank.get(r, since), since) for r in ranks}

    def silences(
        self, lasts: dict[int, float], since: float, until: float
    ) -> dict[int, tuple[float, float]]:
        """Each rank's silence in a stall from `since` to `until`: from its last sign of
        life before it (`lasts`) until it spoke again, else `until`. Not until another rank
        spoke after it: its next stall's silence, from its own sign, would overlap this one
        (ranks whose last signs came within one of the watch's ticks, on a loaded machine)."""
        spoke = {r: self.by_rank.get(r, last) for r, last in lasts.items()}
        return {r: (last, spoke[r] if spoke[r] > since else until) for r, last in lasts.items()}


def where(state, why: str, nccl: bool = False, only_answers: bool = False) -> str:
    """Ask every running rank for its stacks; each full dump goes to its rank log (NCCL
    dumps beside them); return the grouped stacks, "" when no rank runs."""
    return taken(state, why, nccl, only_answers)[1]


def taken(
    state, why: str, nccl: bool = False, only_answers: bool = False
) -> tuple[dict[int, RankStacks], str]:
    """`where`, with each rank's answer (text "" for a rank that gave none)."""
    started = time.monotonic()
    answers, dumps = state.stacks.ask(nccl=nccl)
    if only_answers:  # ranks that ended meanwhile say nothing
        answers = {rank: answer for rank, answer in answers.items() if answer.text}
    answered = [rank for rank, answer in answers.items() if answer.text]
    state.trace.instant("stacks", {"why": why, "ranks": len(answered)}, answered)
    when = f"stacks taken in {time.monotonic() - started:.1f}s"
    return answers, shown(state, why, answers, dumps, when)


def shown(
    state, why: str, answers: dict[int, RankStacks], dumps: dict[int, bytes], when: str
) -> str:
    """The grouped stacks of `answers`, headed by `why` and `when`; each full dump goes
    to its rank log, NCCL dumps beside them; "" without answers."""
    if not answers:
        return ""
    for rank, answer in answers.items():
        if answer.text:
            state.console.keep(rank, [f"[sparkdist] stacks ({why}):", *answer.text.splitlines()])
    entries = group(answers, WAIT_S)
    text = f"Where each rank was ({why}; {when}):"
    text += "".join(f"\n  {entry}" for entry in entries)
    if dumps:
        directory = state.console.save_files(
            {f"{stack_dumps.NCCL_PREFIX}{r}": data for r, data in dumps.items()}
        )
        text += f"\nNCCL flight recorder dumps: {directory}; analyse them with:\n  "
        text += NCCL_COMMAND.format(directory=directory)
    text += f"\n{FULL_STACKS}"
    return text


def show_where(state, exc: BaseException, announce: Callable[[str], None]) -> None:
    """The job ends with `exc`: attach (a time limit, a failure with ranks still running)
    or show (an interrupt) where each rank was, before the ranks are stopped."""
    if isinstance(exc, JobStalledError) or not state.rank_records.running():
        return
    if isinstance(exc, KeyboardInterrupt):
        why = "interrupted"
    elif isinstance(exc, JobTimeoutError):
        why = "the job's time limit ran out"
    elif isinstance(exc, JobFailedError):
        why = "when the first failure was reported"
    else:
        return
    failed = isinstance(exc, JobFailedError)
    text = where(state, why, nccl=not failed, only_answers=failed)
    if not text:
        return
    if isinstance(exc, SparkdistError):
        exc.with_stacks(text)
    else:
        announce(text)


def relook_s(stall_timeout: float) -> float:
    """How long after a look that singled nobody out the watch looks again: a quarter of
    `stall_timeout`, at least `RELOOK_MIN_S`.

    A member stuck while the others are still in their own code (starting, evaluating) is
    singled out only once they wait for it in a collective: it is then dropped within
    `stall_timeout` plus this of its last sign of life, not a whole `stall_timeout` after
    the look. Not every tick: a look asks every rank for its stacks and NCCL dumps (py-spy
    for one that gives none) and keeps them in each `rank-N.log`; a quarter keeps that to
    four looks per `stall_timeout` while a member stays silent, and the floor spares a
    short `stall_timeout` a look every other tick (a look may wait `WAIT_S` itself)."""
    return max(RELOOK_MIN_S, stall_timeout * RELOOK_FRACTION)


class StallClock:
    """When each rank's silence starts to count against `stall_timeout`, and when the
    watch may look next.

    A rank is starting until its first sign of life: importing torch or building a model
    takes seconds to minutes, in silence, on a loaded host, and every rank may do it at
    once. Its start counts against `start_timeout` (from when the watch saw it started):
    one silent that long is silent since its start. A starting rank shields the members
    that may be waiting for it (`shielded`). After that a rank's silence counts from its
    own last sign of life, never from before `since`."""

    def __init__(self, start_timeout: float) -> None:
        self.start_timeout = start_timeout
        self._started: dict[int, float] = {}
        """When the watch first saw each rank started (monotonic seconds)."""
        self._joined: dict[int, float] = {}
        """When the watch first saw each rank a member of the world (-inf: a member of the
        world it began with)."""
        self.since = self._next_look = time.monotonic()
        """`since`: the watch's start (a relaunched attempt is watched anew with a new
        clock) or its last drop (the re-formed world's survivors count anew)."""

    def restart(self) -> None:
        """The world re-formed: every member's silence counts from now."""
        self.since = time.monotonic()

    def look_later(self, wait_s: float) -> None:
        """A look singled nobody out: the next one waits `wait_s`, and counts as before."""
        self._next_look = time.monotonic() + wait_s

    def may_look(self, now: float) -> bool:
        """Whether the last look that singled nobody out is far enough behind."""
        return now >= self._next_look

    def note(self, records: RankRecords, members: list[int], now: float) -> None:
        """Note the ranks that started, and the `members` that joined the world, since the
        last tick (under the job's lock). The first note's members (the attempt's first
        ranks, a warm run's world) were members from the start; a newcomer joins once it
        entered `elastic.run` (`membership.Grows`)."""
        for rank, record in records.by_rank.items():
            if record.started:
                self._started.setdefault(rank, now)
        joined = now if self._joined else -math.inf
        for rank in members:
            self._joined.setdefault(rank, joined)

    def starting(self, life: SignsOfLife, ranks: list[int], now: float) -> list[int]:
        """The `ranks` that showed no sign of life yet, within `start_timeout` of their start."""
        return [
            r
            for r in ranks
            if r not in life.by_rank and now - self._started.get(r, now) < self.start_timeout
        ]

    def shielded(self, life: SignsOfLife, ranks: list[int], now: float) -> set[int]:
        """The `ranks` that may be waiting for a starting one (its start is no stall, nor
        theirs): the starting ones, and every other that spoke since one of them joined.

        The world's first ranks start together, and the early ones wait in the first
        collective for the late ones: one of them starting shields every member (so does
        a member of a warm run's world, or of a relaunched attempt's). Nobody
        waits for a newcomer before its world forms (it joins as it enters `elastic.run`),
        so a member silent since before then (stuck in its own code) is not shielded by
        it: it is looked at as any silent member (issue 64's soak: a newcomer's 25 s import
        kept a member stuck on a lock from being dropped until it spoke)."""
        starting = self.starting(life, ranks, now)
        joined = min((self._joined.get(r, now) for r in starting), default=math.inf)
        spoke = life.by_rank
        return {r for r in ranks if r in starting or spoke.get(r, -math.inf) >= joined}

    def silences(self, life: SignsOfLife, ranks: list[int], now: float) -> dict[int, float]:
        """How long each of `ranks` has been silent (from its start when it never spoke)."""
        started = self._started
        return {r: now - max(life.by_rank.get(r, started.get(r, now)), self.since) for r in ranks}


class StallWatch:
    """An attempt's watch for stalls and stragglers (a daemon thread, `TICK_S`).

    `stall_timeout` counts from each rank's first sign of life (`StallClock`). In an
    in-process elastic world (`membership.py`; not given: `ELASTIC_STALL_TIMEOUT_S`) each
    member is watched alone: one silent that long, whatever the others said meanwhile
    (their own lines when their collective timed out), is dropped if it holds the others
    back (`stacks.stopped`): named, killed (`KillRank`), and lost as a killed rank is, so
    the world re-forms without it; when a look singles nobody out (the others still in
    their own code), the next comes `relook_s` later, not a `stall_timeout`. Only when no
    rank showed a sign of life for `stall_timeout` and none can be singled out, or the
    world cannot lose them (fewer than `min_np` left), does a `stall_timeout` given fail
    the job; the default one never does (the job goes on, as after a warning)."""

    def __init__(self, state, options, job_id: str, announce: Callable[[str], None], follow=None):
        self.state, self.job_id, self.announce = state, job_id, announce
        self.warning_s, self.timeout_s = options.stall_warning, options.stall_timeout
        self.default = self.timeout_s is None and state.membership.min_np is not None
        """The in-process elastic default: it drops stopped ranks, and fails no job."""
        if self.default:
            self.timeout_s = ELASTIC_STALL_TIMEOUT_S
        self._clock = StallClock(options.start_timeout)
        self._stop = threading.Event()
        self._warned_at: float | None = None
        self._silent: dict[int, float] = {}
        """The ranks running when the stall was noticed, with their last signs of life."""
        self._thread = threading.Thread(target=self._run, daemon=True, name="sparkdist-stalls")
        self._follow = follow
        """Where the state to watch is now: a warm world's run whose world relaunched
        (`warm.WarmDispatch.attach`) goes on in new ranks, which the old state never hears."""

    def __enter__(self) -> StallWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._warned_at is not None:  # a stall the job's end ended
            self._trace_stall(self.state.life)

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self._tick()
            except Exception:  # noqa: BLE001 - the watch never fails the job by itself
                logger.exception("sparkdist job %s: the stall watch failed", self.job_id)

    def _tick(self) -> None:
        if self._follow is not None and self._follow() is not self.state:
            self._take(self._follow())
        state, life = self.state, self.state.life
        with state.cond:  # ranks an in-process world went on without step no more
            gone = set(state.membership.left)
        notes = life.stragglers.check(time.monotonic(), state.rank_records, gone)
        for note in notes:
            self.announce(f"sparkdist job {self.job_id}: {note}")
        if notes:
            state.metrics.straggling(sorted(life.stragglers.slow))
        if not state.rank_records.all_started():
            return  # start_timeout watches the start
        if state.failures.failed:
            return  # the attempt ends (a warm world's relaunch is watched anew: `follow`)
        now = time.monotonic()
        idle = now - life.last
        if self._warned_at is not None and self._warned_at != life.last:
            self._trace_stall(life)  # the ranks spoke again: the stall ends here
        due = self._due(now) if self.timeout_s is not None else None
        if due is not None:
            self._timed_out(idle, *due)
        elif self.warning_s is not None and idle >= self.warning_s:
            if self._warned_at != life.last:
                self._noticed(life.last)
                why = f"no sign of life for {idle:.0f}s, stall_warning={self.warning_s:g}"
                self._warn(idle, where(state, why, nccl=True))

    def _take(self, state) -> None:
        """Watch the relaunched attempt's state anew (a stall of the old one ends here)."""
        if self._warned_at is not None:
            self._trace_stall(self.state.life)
        self.state, self._clock = state, StallClock(self._clock.start_timeout)

    def _due(self, now: float) -> tuple[bool, dict[int, float]] | None:
        """What `stall_timeout` finds now: whether no rank showed a sign of life that long
        (none starts), and the elastic world's members silent that long but those a starting
        rank shields (`StallClock.shielded`); None: nothing, or a look found nobody just now."""
        state, life, clock = self.state, self.state.life, self._clock
        with state.cond:
            by_rank = state.rank_records.by_rank
            ranks = [r for r in state.membership.survivors() if not by_rank[r].exited]
            clock.note(state.rank_records, ranks, now)
            elastic = state.membership.min_np is not None
        if not clock.may_look(now):
            return None
        shielded = clock.shielded(life, ranks, now)
        stalled = not shielded and now - max(life.last, clock.since) >= self.timeout_s
        watched = [r for r in ranks if r not in shielded]
        silences = clock.silences(life, watched, now) if elastic else {}
        silent = {r: s for r, s in silences.items() if s >= self.timeout_s}
        return (stalled, silent) if stalled or silent else None

    def _warn(self, idle: float, text: str) -> None:
        """Say where each rank is (`text`); the job goes on."""
        self.announce(
            f"sparkdist job {self.job_id}: no rank showed a sign of life for "
            f"{idle:.0f}s (stall_warning={self.warning_s:g}); the job goes on.\n" + text
        )

    def _timed_out(self, idle: float, stalled: bool, silent: dict[int, float]) -> None:
        """No sign of life for `stall_timeout` (`stalled`: from any rank; `silent`: from
        these members): drop the ranks that hold an in-process world back, else fail a
        stalled job (by default: go on, as after a warning); without either, look again
        `relook_s` later (`stall_timeout` where no look drops: the default out of process)."""
        state, since = self.state, self.state.life.last
        why = f"no sign of life for {idle:.0f}s, stall_timeout={self.timeout_s:g}"
        if not stalled:
            who = spans(sorted(silent))
            why = f"rank{'s' if len(silent) > 1 else ''} {who} silent for "
            why += f"{max(silent.values()):.0f}s, stall_timeout={self.timeout_s:g}"
        answers, text = taken(state, why, nccl=True)
        if self._drop_stopped(answers, text, silent):
            self._noticed(self._warned_at or since)  # traced once a rank speaks again
            return
        if self.default or not stalled:
            drops = not self.default or state.membership.in_process()
            wait_s = relook_s(self.timeout_s) if drops else self.timeout_s
            self._clock.look_later(wait_s)
            said = f"{why}; nobody singled out, next look in {wait_s:g}s"
            logger.debug("sparkdist job %s: %s", self.job_id, said)
            warn = self.warning_s is not None and idle >= self.warning_s
            if warn and self._warned_at != since:
                self._noticed(since)
                self._warn(idle, text)
            return
        reason = f"stalled: no rank showed a sign of life for {idle:.0f}s; the job was stopped."
        state.failures.fail_now(JobStalledError(reason).with_stacks(text))
        self._noticed(self._warned_at or since)
        self._trace_stall(state.life)
        self._stop.set()

    def _drop_stopped(
        self, answers: dict[int, RankStacks], text: str, silent: dict[int, float]
    ) -> bool:
        """An elastic world's members that hold the others back (`stacks.stopped`): name
        each, with why, kill it and let the world re-form without it (in process), or
        relaunch from its checkpoint (the relaunch path: its death is a loss like any
        killed rank's; only with a `stall_timeout` given). False when there is none, or
        the world cannot go on without them."""
        state, membership = self.state, self.state.membership
        with state.cond:
            if membership.min_np is None:
                return False
            members = membership.survivors()
            links = {r: state.peers.channel("supervisor", r) for r in members}
            chosen = stopped(answers, members).items()
            dropped = {r: why for r, why in chosen if links[r] is not None and r in silent}
            left = len(members) - len(dropped)  # the world re-forms in process without them
            in_process = membership.in_process(dropped)
            if not dropped or left < membership.min_np or (self.default and not in_process):
                return False
        goes_on = "the world goes on without it" if in_process else "the job relaunches"
        limit = f"stall_timeout={self.timeout_s:g}"
        for rank, why in dropped.items():
            host = answers[rank].host
            state.losses.silenced(
                rank,
                f"rank {rank} on host {host} was silent for {silent[rank]:.0f}s ({limit}): {why}",
            )
            said = (
                f"rank {rank} (host {host}) is silent: no sign of life for {silent[rank]:.0f}s "
                f"({limit}); {why}. It is killed; {goes_on}."
            )
            state.console.keep(rank, [f"[sparkdist] {said}"])
            self.announce(f"sparkdist job {self.job_id}: {said}")
        self.announce(text)
        for rank in dropped:
            send([links[rank]], messages.KillRank(f"silent for {silent[rank]:.0f}s ({limit})"))
        self._clock.restart()
        return True

    def _noticed(self, since: float) -> None:
        """A stall since `since` (monotonic): its running ranks are its silent ones, each
        from its last sign of life, taken now (one that speaks replaces it)."""
        if self._warned_at != since:
            with self.state.cond:
                self._silent = self.state.life.lasts(self.state.rank_records.running(), since)
        self._warned_at = since

    def _trace_stall(self, life: SignsOfLife) -> None:
        """The stall that began at the last warning's sign of life, in the trace: on the
        driver, until a rank spoke again (else now), and each rank's silence in it
        (`SignsOfLife.silences`), on one mapping of the clocks: stalls that meet, meet."""
        since, self._warned_at = self._warned_at, None
        until = life.last if life.last > since else time.monotonic()
        at = self.state.trace.at_us
        silences = life.silences(self._silent, since, until).items()
        silent = {rank: (at(last), at(spoke)) for rank, (last, spoke) in silences}
        why = f"no sign of life for {until - since:.0f}s"
        self.state.trace.stall(at(since), at(until), why, silent)
