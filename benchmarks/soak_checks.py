"""The chaos soak's invariants and its table (issue 64), from a run's records: the
steps world rank 0 wrote (`steps.jsonl`), the faults as they were done, the job's
result and log, and what was left after it.

Each check returns (ok, why) so that the soak reports every one, and the test asserts
every one.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict

from soak_faults import world_of

from sparkdist.runner.driver.stalls import relook_s

WEIGHT_TOLERANCE = 1e-4
"""Final weights against the fault-free control's, absolute on weights of order 1-8:
every step reads the same G rows in the same order whatever the world's size (the loader's
global batch), and redone steps start from the committed state, so the only difference
is the summation order of the gradient (DDP sums 2 or 3 partial sums, each over its share
of the rows, in float32): a relative 1e-7 a step, which SGD's contraction keeps from
growing (measured: below 1e-5 after 300 steps)."""
LOSS_TOLERANCE = 0.005
MEMORY_RATIO = 1.2


def committed(steps: list[dict]) -> tuple[list[dict], list[dict]]:
    """(the committed steps, the redone lines): a step written again after a world went
    back to its last commit replaces the one written before (the last line of a step
    number is the one that stood)."""
    kept: dict[int, dict] = {}
    redone: list[dict] = []
    high = 0
    for row in steps:
        if row["step"] <= high:
            redone.append(row)
        high = max(high, row["step"])
        kept[row["step"]] = row
    return [kept[s] for s in sorted(kept)], redone


def check_steps(
    steps: list[dict], target: int, fired: list, per_fault: int, saved: list[dict] | None = None
) -> tuple[bool, str]:
    """Committed steps 1..target, each once; each redone step charged to the fault before
    it, at most `per_fault` per fault. A fault after which the job relaunched (its steps'
    `attempt` grew; an in-process world left below `min_np` relaunches too) may redo what
    no checkpoint held when each relaunch began: the steps since the newest one `saved`
    (rank 0's records), a checkpoint interval unless a save failed (the store's disk
    full), and a relaunch must resume from that checkpoint or a newer one."""
    kept, redone = committed(steps)
    numbers = [row["step"] for row in kept]
    if numbers != list(range(1, target + 1)):
        return False, f"committed steps are not 1..{target}: {numbers[:5]}...{numbers[-5:]}"
    times = [row["at"] for row in kept]
    if any(b <= a for a, b in zip(times, times[1:], strict=False)):
        return False, "committed steps out of time order"
    unsaved = relaunches(steps, saved or [])
    behind = [(at, first, newest) for at, first, newest, _ in unsaved if first <= newest]
    if behind:
        return False, f"relaunches resumed before the newest checkpoint (at, step, saved): {behind}"
    charged = charge(redone, fired)
    relaunched = relaunched_after(steps, fired)
    limits = {i: max(per_fault, _unsaved_after(i, fired, unsaved)) for i in relaunched}
    over = {i: n for i, n in charged.items() if i == -1 or n > limits.get(i, per_fault)}
    worst = max(charged.values(), default=0)
    if over:
        limit = f"at most {per_fault} a fault, what no checkpoint held a relaunch"
        return False, f"steps redone {dict(charged)} ({limit}; over: {over})"
    why = f"{target} committed once each; {len(redone)} redone (at most {worst} a fault"
    return True, why + (f"; {len(relaunched)} relaunched)" if relaunched else ")")


def relaunches(steps: list[dict], saved: list[dict]) -> list[tuple[float, int, int, int]]:
    """Each relaunch, as (when its first step was written, that step, the newest checkpoint
    saved before then, the highest step written before then): the steps it may redo are
    the last minus the third."""
    found, attempt, high = [], None, 0
    for row in steps:
        if attempt is not None and world_of(row)[0] > attempt:
            newest = max((s["step"] for s in saved if s["at"] <= row["at"]), default=0)
            found.append((row["at"], row["step"], newest, high))
        attempt = max(world_of(row)[0], attempt if attempt is not None else 0)
        high = max(high, row["step"])
    return found


def _unsaved_after(i: int, fired: list, unsaved: list) -> int:
    """The steps no checkpoint held at the relaunches after done fault `i`, before the next."""
    done = [f for f in fired if not f.skipped]
    stop = done[i + 1].at if i + 1 < len(done) else math.inf
    return sum(high - newest for at, _, newest, high in unsaved if done[i].at < at < stop)


def relaunched_after(steps: list[dict], fired: list) -> set[int]:
    """The faults (indices among those done) after which, before the next, a step ran
    in a later attempt than the steps before the fault."""
    done = [f for f in fired if not f.skipped]
    found = set()
    for i, f in enumerate(done):
        stop = done[i + 1].at if i + 1 < len(done) else math.inf
        before = [world_of(r)[0] for r in steps if r["at"] <= f.at]
        after = [world_of(r)[0] for r in steps if f.at < r["at"] < stop]
        if before and after and max(after) > before[-1]:
            found.add(i)
    return found


def charge(redone: list[dict], fired: list) -> Counter:
    """index of the fault -> lines redone after it and before the next one."""
    counts: Counter = Counter()
    done = [f for f in fired if not f.skipped]
    for row in redone:
        before = [i for i, f in enumerate(done) if f.at <= row["at"]]
        counts[before[-1] if before else -1] += 1
    return counts


def check_rows(steps: list[dict], rows: int, global_batch: int) -> tuple[bool, str]:
    """Every committed step read `global_batch` rows; every finished epoch each row once,
    the unfinished last one no row twice."""
    kept, _ = committed(steps)
    short = [row["step"] for row in kept if len(row["ids"]) != global_batch]
    if short:
        return False, f"steps not at the global batch of {global_batch}: {short[:10]}"
    epochs = defaultdict(Counter)
    for row in kept:
        epochs[row["epoch"]].update(row["ids"])
    for epoch, counts in sorted(epochs.items()):
        twice = [i for i, n in counts.items() if n > 1]
        if twice:
            return False, f"epoch {epoch}: rows read twice {twice[:10]}"
        if epoch != max(epochs) and len(counts) != rows:
            return False, f"epoch {epoch}: {rows - len(counts)} rows never read"
    return True, f"{len(epochs)} epochs, each row once, {global_batch} rows a step"


def check_same_rows(steps: list[dict], control: list[dict]) -> tuple[bool, str]:
    """Every committed step read the rows the control's step of that number read: the
    condition under which the final weights can equal the control's."""
    mine = {row["step"]: sorted(row["ids"]) for row in committed(steps)[0]}
    theirs = {row["step"]: sorted(row["ids"]) for row in committed(control)[0]}
    other = [step for step, ids in mine.items() if theirs.get(step) != ids]
    if other:
        return False, f"{len(other)} steps read other rows than the control's: {other[:5]}"
    return True, f"{len(mine)} steps read the control's rows"


def final_values(result: dict) -> list[dict]:
    return [v for v in result.get("values") or [] if v is not None]


def check_final(soak: dict, control: dict) -> tuple[bool, str]:
    """The final weights within WEIGHT_TOLERANCE of the control's, the loss within 0.5 %."""
    mine, theirs = final_values(soak), final_values(control)
    if not mine or not theirs:
        return False, "no final values"
    diff = max(abs(a - b) for a, b in zip(mine[0]["weights"], theirs[0]["weights"], strict=True))
    loss = abs(mine[0]["loss"] - theirs[0]["loss"]) / theirs[0]["loss"]
    ok = diff <= WEIGHT_TOLERANCE and loss <= LOSS_TOLERANCE
    return ok, f"weights within {diff:.1e} (<= {WEIGHT_TOLERANCE:g}), loss within {loss:.2%}"


def check_target(result: dict, target: int) -> tuple[bool, str]:
    if not result.get("ok"):
        return False, f"the job failed: {result.get('error_type')}: {result.get('error')}"
    steps = {v["step"] for v in final_values(result)}
    if steps != {target}:
        return False, f"the ranks ended at steps {steps}, not {target}"
    attempts = result.get("attempts") or 1
    return True, f"step {target} reached by {len(final_values(result))} ranks, {attempts} attempts"


def check_saved(saved: list[dict], target: int) -> tuple[bool, str]:
    """The relaunch path's commits: the checkpoints rank 0 saved, in the order saved,
    strictly increase (none saved twice: a relaunch resumes from the newest), up to at
    most the target."""
    numbers = [row["step"] for row in saved]
    back = [(a, b) for a, b in zip(numbers, numbers[1:], strict=False) if b <= a]
    if back:
        return False, f"checkpoints saved out of order or twice: {back[:5]}"
    if numbers and numbers[-1] > target:
        return False, f"a checkpoint of step {numbers[-1]} beyond the target {target}"
    return True, f"{len(numbers)} checkpoints saved, each step once, in order"


def check_silent(fired: list, log: str, stall_timeout_s: float, step_s: float) -> tuple[bool, str]:
    """Each SIGSTOPped or stuck rank named silent in the job's log (with its stacks or why
    there are none), and gone within stall_timeout + a step + the stacks' wait (4 s) + the
    stall watch's tick (1 s) after it stopped: its silence counts from its own last sign
    of life, whatever the others say meanwhile. One stopped while its peers were still in
    their own code (starting after a relaunch) is singled out only at the first look after
    they wait for it: a re-look (`relook_s`) more."""
    allowed = stall_timeout_s + relook_s(stall_timeout_s) + step_s + 4.0 + 1.0
    notes = []
    for f in fired:
        if f.fault.kind not in ("sigstop", "stuck") or f.skipped:
            continue
        took = None if f.dropped_at is None else f.dropped_at - f.at
        if took is None or took > allowed:
            return False, f"{f.fault.kind} of {f.target}: dropped after {took} s (> {allowed} s)"
        notes.append(f"{f.fault.kind} {took:.1f}s")
    named = log.count("is silent: no sign of life")
    wanted = sum(1 for f in fired if f.fault.kind in ("sigstop", "stuck") and not f.skipped)
    if named < wanted or (wanted and "Where each rank was" not in log):
        return False, f"{named} silent ranks named in the job's log, {wanted} stopped or stuck"
    return True, f"named silent with stacks or why not, dropped in {', '.join(notes) or '-'}"


def check_memory(soak: dict, control: dict) -> tuple[bool, str]:
    worse = {
        who: (peak, control.get(who, 0))
        for who, peak in soak.items()
        if peak > MEMORY_RATIO * control.get(who, math.inf)
    }
    if worse:
        return False, f"peaks above {MEMORY_RATIO}x the control's (MiB): {worse}"
    ratio = max(peak / control[who] for who, peak in soak.items() if control.get(who))
    return True, f"peak memory at most {ratio:.2f}x the control's"


def median_step_s(steps: list[dict]) -> float:
    kept, _ = committed(steps)
    gaps = [b["at"] - a["at"] for a, b in zip(kept, kept[1:], strict=False)]
    return statistics.median(gaps) if gaps else math.nan


def recovery_s(fired, following, steps: list[dict]) -> float | None:
    """From the fault to the first step of a world formed after it (before the next fault;
    a step the next fault has redone counts); for a fault that changed no world (a slow
    rank, a full disk), to the first committed step after it: the job trains on through
    it, so its length is no cost of its own."""
    kept, _ = committed(steps)
    stop = following.at if following is not None else math.inf
    then = (fired.attempt, fired.generation)
    newer = [r for r in steps if fired.at < r["at"] < stop and world_of(r) > then]
    if newer:
        return newer[0]["at"] - fired.at
    later = [r for r in kept if r["at"] > fired.at]
    return later[0]["at"] - fired.at if later else None


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(share * len(ordered)) - 1)]


def table(fired: list, steps: list[dict], job_ok: bool, step_s: float) -> tuple[str, dict]:
    """The per-kind table (injected, survived, steps redone, fault -> next committed
    step p50/p99, and the training time the kind cost) as text, and the same as data.

    A fault's cost is its recovery less the one step that would have been committed
    meanwhile anyway (`step_s`, the control's median step): the wall time it took from
    training. What the faults do not explain (the world growing back between them, steps
    slower than the control's) is `unexplained_s`, from `wall_s` by the goodput."""
    done = [f for f in fired if not f.skipped]
    charged = charge(committed(steps)[1], fired)
    kinds: dict[str, dict] = {}
    for i, f in enumerate(done):
        row = kinds.setdefault(
            f.fault.kind, {"injected": 0, "survived": 0, "redone": 0, "s": [], "lost_s": 0.0}
        )
        row["injected"] += 1
        took = recovery_s(f, done[i + 1] if i + 1 < len(done) else None, steps)
        if took is not None and job_ok:
            row["survived"] += 1
            row["s"].append(took)
            row["lost_s"] += max(0.0, took - step_s)
        row["redone"] += charged.get(i, 0)
    head = f"{'fault':<14}{'injected':>9}{'survived':>9}{'redone':>7}{'p50 s':>8}{'p99 s':>8}"
    lines = [head + f"{'lost s':>8}"]
    for kind, row in sorted(kinds.items()):
        p50 = f"{percentile(row['s'], 0.5):8.1f}" if row["s"] else f"{'-':>8}"
        p99 = f"{percentile(row['s'], 0.99):8.1f}" if row["s"] else f"{'-':>8}"
        counts = f"{kind:<14}{row['injected']:>9}{row['survived']:>9}{row['redone']:>7}"
        lines.append(f"{counts}{p50}{p99}{row['lost_s']:8.1f}")
    skipped = [f"{f.fault.kind}: {f.skipped}" for f in fired if f.skipped]
    if skipped:
        lines.append("not done: " + "; ".join(skipped))
    return "\n".join(lines), kinds


def time_lost(kinds: dict, steps: list[dict], step_s: float) -> dict[str, float]:
    """Where the wall time that trained nothing went: the faults' cost by kind
    (`table`'s `lost_s`) and what they leave unexplained."""
    kept, _ = committed(steps)
    wall = kept[-1]["at"] - kept[0]["at"] if len(kept) > 1 else 0.0
    lost = wall - (len(kept) - 1) * step_s
    by_kind = {kind: round(row["lost_s"], 1) for kind, row in kinds.items()}
    return {
        "lost_s": round(lost, 1),
        **by_kind,
        "unexplained_s": round(lost - sum(by_kind.values()), 1),
    }
