"""Names for the Spark jobs sparkdist submits, and a progress display while they run.

In the Spark UI every job sparkdist starts says what it is ("sparkdist train: 2 ranks,
barrier, attempt 1 (job 1a2b3c)", "sparkdist ensemble: 8 x RandomForestClassifier").
On a classic session that is the job group's description (`sc.setJobGroup`, per
thread); a Spark Connect client has neither job groups nor descriptions, only tags, so
the job carries its cancel tag plus a tag holding the description.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sparkdist import progress
from sparkdist.spark.cluster import is_connect_session

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.5
_TAG_CHARS = re.compile(r"[,\s]+")


_purpose = threading.local()


@contextlib.contextmanager
def purpose(text: str) -> Iterator[None]:
    """Jobs described from this thread while inside also say `text` (e.g. which tune
    trial a runner job is)."""
    _purpose.text = text
    try:
        yield
    finally:
        _purpose.text = None


def purpose_suffix() -> str:
    """ ", <purpose>" inside `purpose`, else ""."""
    text = getattr(_purpose, "text", None)
    return f", {text}" if text else ""


def description_tag(description: str) -> str:
    """`description` as a Spark Connect tag (tags may not contain commas)."""
    return _TAG_CHARS.sub(" ", description).strip() or "sparkdist"


@contextlib.contextmanager
def described(session: Any, description: str, group: str | None = None) -> Iterator[str]:
    """Jobs this thread submits on `session` while inside carry `description`, under the
    job group (classic) or tag (Connect) `group`, which it yields so that the jobs can be
    cancelled. Without `group`, a classic thread keeps the job group it has (a Databricks
    notebook cell's, which its Cancel button cancels) or gets a new one; what the thread
    had is restored on the way out."""
    if is_connect_session(session):
        tags = [group or f"sparkdist-{uuid.uuid4().hex[:12]}", description_tag(description)]
        for tag in tags:
            session.addTag(tag)
        try:
            yield tags[0]
        finally:
            for tag in tags:
                session.removeTag(tag)
        return
    sc = session.sparkContext if hasattr(session, "sparkContext") else session
    keys = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
    before = {key: sc.getLocalProperty(key) for key in keys}
    group = group or before["spark.jobGroup.id"] or f"sparkdist-{uuid.uuid4().hex[:12]}"
    sc.setJobGroup(group, description, True)
    try:
        yield group
    finally:
        for key, value in before.items():
            sc.setLocalProperty(key, value)


@dataclass(frozen=True)
class StageCount:
    """One stage's tasks: done of total."""

    stage_id: int
    done: int
    total: int


def tasks_done(stages: list[StageCount]) -> tuple[int, int]:
    """(done, total) of every task of the watched jobs: the default count."""
    return sum(s.done for s in stages), sum(s.total for s in stages)


@contextlib.contextmanager
def watched(
    session: Any,
    group: str,
    desc: str,
    unit: str = "tasks",
    count: Callable[[list[StageCount]], tuple[int, int]] = tasks_done,
) -> Iterator[None]:
    """A progress display of the jobs of `group` while inside, as `count` reads their
    stages (by default the tasks done of all): classic sessions poll Spark's status
    tracker; Connect clients get the server's progress reports."""
    if progress.mode() == "off":
        yield
        return
    with progress.bar(None, desc, unit=unit) as bar:
        if is_connect_session(session):
            with _connect_progress(session, bar, count):
                yield
        else:
            with _classic_progress(session.sparkContext, group, bar, count):
                yield


def _show(bar: progress.Bar, count: Callable, stages: list[StageCount], final: bool) -> None:
    if not stages:
        return
    if final:  # a stage whose output was there already is skipped: its tasks never run
        stages = [StageCount(s.stage_id, s.total, s.total) for s in stages]
    done, total = count(stages)
    if total:
        bar.total_now(total)
        bar.set(done)


@contextlib.contextmanager
def _classic_progress(sc: Any, group: str, bar: progress.Bar, count: Callable) -> Iterator[None]:
    stop = threading.Event()
    tracker = sc.statusTracker()
    earlier = set(tracker.getJobIdsForGroup(group))  # e.g. a notebook cell's jobs so far

    def update(final: bool = False) -> None:
        stages = []
        succeeded = True
        for job_id in set(tracker.getJobIdsForGroup(group)) - earlier:
            job = tracker.getJobInfo(job_id)
            succeeded = succeeded and job is not None and job.status == "SUCCEEDED"
            for stage_id in job.stageIds if job else ():
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    stages.append(StageCount(stage_id, stage.numCompletedTasks, stage.numTasks))
        _show(bar, count, stages, final and succeeded)

    def poll() -> None:
        while not stop.wait(WATCH_INTERVAL_S):
            update()

    thread = threading.Thread(target=poll, name=f"{group}-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    update(final=True)


@contextlib.contextmanager
def _connect_progress(session: Any, bar: progress.Bar, count: Callable) -> Iterator[None]:
    def handler(stages, inflight_tasks, operation_id, done) -> None:
        counts = [StageCount(s.stage_id, s.num_completed_tasks, s.num_tasks) for s in stages or ()]
        _show(bar, count, counts, final=False)

    session.registerProgressHandler(handler)
    try:
        yield
    finally:
        session.removeProgressHandler(handler)
