"""`elastic.run`: the loop that keeps a rank's process through changes of its world.

On each entry: join the driver's newest world, form its torch process group, sync the state
from world rank 0 and call the function. When the world changes, a rank stops at its next
commit (`WorldChanged`: nothing to undo) or its collective fails (a peer was lost: back to
the last commit); either way it ends the group, waits for the next world and goes round
again, in the same process. Horovod's `hvd.elastic.run`, on torch.distributed.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from sparkdist import job_environment
from sparkdist.elastic import torch_group
from sparkdist.elastic.generations import (
    Generation,
    Generations,
    Watcher,
    WorldChanged,
    WorldEnded,
    WorldStuck,
)
from sparkdist.elastic.state import State
from sparkdist.protocol import driver_channel

logger = logging.getLogger(__name__)

T = TypeVar("T")
DEFAULT_REFORM_LIMIT = 10
_launch_rank: int | None = None  # RANK when this process first entered `run`


def launch_rank() -> int:
    """This process's launch rank (its `RANK` at start), read once: `run` rewrites `RANK`
    for each world."""
    global _launch_rank
    if _launch_rank is None:
        if os.environ.get(job_environment.LAUNCHER) == "mpi":
            logger.warning(
                "elastic.run: the mpi launcher ends every rank when one is lost; "
                'survivors keep their processes only with launcher="direct"'
            )
        _launch_rank = int(os.environ["RANK"])
    return _launch_rank


def reform_limit(env=os.environ) -> int:
    """`SPARKDIST_ELASTIC_REFORM_LIMIT`: how many times in a row a world may break and
    re-form of the same members with no commit between (default 10), checked early."""
    text = env.get(job_environment.ELASTIC_REFORM_LIMIT, "")
    if not text:
        return DEFAULT_REFORM_LIMIT
    if not text.isdigit():
        name = job_environment.ELASTIC_REFORM_LIMIT
        raise ValueError(f"{name} must be a whole number >= 0, not {text!r}")
    return int(text)


def run(func: Callable[..., T]) -> Callable[..., T | None]:
    """Run `func(state, *args, **kwargs)` in a world that may change under it.

    `func` starts over (with `state` as committed, synced from world rank 0) each time the
    world re-forms; it returns its value on success. A rank that is no longer a member
    returns None. An exception from `func` that is not a broken collective propagates.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> T | None:
        if not isinstance(state, State):
            kind = type(state).__name__
            raise TypeError(f"elastic.run: the first argument must be an elastic State, not {kind}")
        client = driver_channel.driver_client()
        if client is None:
            raise RuntimeError(
                "elastic.run runs in a sparkdist rank: start the function "
                "with HorovodRunner(...).run"
            )
        return _Loop(state, Generations(client, launch_rank())).run(func, args, kwargs)

    return wrapper


class _Loop:
    """One call of a `run` function: its worlds, one after another."""

    def __init__(self, state: State, generations: Generations):
        self.state, self.generations = state, generations
        self.launch_rank = generations.launch_rank
        self.limit_s = torch_group.timeout_s()
        self.wait_s = driver_channel.RENDEZVOUS_TIMEOUT_S
        self.reform_limit = reform_limit()
        self._watcher: Watcher | None = None
        self._stuck: list[int] = []
        """The worlds that broke since this rank's last commit and re-formed of the same
        members (`_count_break`)."""
        self._commits_at_break = -1

    def run(self, func: Callable[..., T], args: tuple, kwargs: dict) -> T | None:
        torch_group.end_left_formed()  # an earlier run's world
        generation = self.generations.first(self.wait_s)
        reformed = False
        while generation.world_rank(self.launch_rank) is not None:
            try:
                value = self._enter(generation, reformed, func, args, kwargs)
                later = self.generations.finish(generation.number)
                if later is None:
                    return value
                # A grow formed a world with this rank as it returned: newcomers wait in
                # it. Run again there, from the state committed last (they get it).
                logger.info("elastic: world %d formed as rank returned", later.number)
                torch_group.end_left_formed()
                generation, reformed = later, True
                continue
            except WorldChanged:
                logger.info("elastic: world %d ends at a commit", generation.number)
                failure = None
            except Exception as exc:  # noqa: BLE001 - a broken world is retried, the rest raised
                if not self.state.is_collective_failure(exc) and not self._superseded():
                    raise
                logger.warning(
                    "elastic: world %d broke (%s: %s); back to the last commit",
                    generation.number,
                    type(exc).__name__,
                    exc,
                )
                traceback.clear_frames(exc.__traceback__)  # let the old world's DDP go
                self.state.restore()
                failure = exc
            # Free the old world's objects (its DDP), then its process group: in that order,
            # or the group's destructor may wait for the GIL (see free_old_groups).
            gc.collect()
            torch_group.free_old_groups()
            broken, generation = generation, self._next(generation, failure)
            if failure is not None:
                self._count_break(broken, generation, failure)
            reformed = True
        logger.info(
            "elastic: rank %d is not in world %d (%s): leaving",
            self.launch_rank,
            generation.number,
            generation.reason,
        )
        return None

    def _enter(self, generation: Generation, reformed: bool, func, args, kwargs):
        """Form `generation`'s group, sync, call `func`: its value, or an exception. The group
        stays formed after success (user code may still use it), and ends otherwise."""
        self._watcher = None
        group = self.state.form_world(
            generation, self.launch_rank, self.generations.client, self.limit_s
        )

        def on_newer(newer: Generation) -> None:  # in the watcher's thread
            if set(generation.members) - set(newer.members) and not newer.planned:
                group.abort()  # a lost member blocks NCCL collectives forever

        watcher = self._watcher = Watcher(self.generations, generation, on_newer).start()
        state, returned = self.state, False
        state.enter_world(group, watcher)
        try:
            if reformed:
                state.on_reset()
            state.sync()
            state.announce_world()
            value = func(state, *args, **kwargs)
            returned = True
        finally:
            if not returned:
                group.destroy()
            watcher.stop()
            state.leave_world(keep_group=returned)
        torch_group.leave_formed(group)
        return value

    def _count_break(self, broken: Generation, after: Generation, failure: Exception) -> None:
        """Raise `WorldStuck` when `broken` is the world after `reform_limit` others that
        broke and re-formed of the same members with no commit between: a fault that
        recurs at the same step would else re-form the world forever (each member counts
        the same worlds, so all stop together). A break after a commit starts the count
        again; a re-form that lost or took in members is a change, not counted."""
        if self.state.made_commits != self._commits_at_break:
            self._stuck, self._commits_at_break = [], self.state.made_commits
        if set(after.members) != set(broken.members):
            return
        self._stuck.append(broken.number)
        if len(self._stuck) <= self.reform_limit:
            return
        values = self.state.values()
        where = ", ".join(f"{k}={v}" for k, v in values.items() if type(v) is int)
        raise WorldStuck(
            f"elastic.run: worlds {self._stuck} broke one after another with the same "
            f"members and no commit between them, more than "
            f"{job_environment.ELASTIC_REFORM_LIMIT}={self.reform_limit} times: a fault "
            f"that recurs at the same step. Stuck at this rank's commit "
            f"{self.state.made_commits}{f' ({where})' if where else ''}; the last break: "
            f"{type(failure).__name__}: {failure}"
        ) from failure

    def _superseded(self) -> bool:
        """Had the driver formed a newer world when the exception came (it caused it)?"""
        return self._watcher is not None and self._watcher.newer is not None

    def _next(self, generation: Generation, failure: BaseException | None) -> Generation:
        """The world after `generation`; a failure that no new world answers is raised."""
        try:
            broke = failure is not None  # the driver re-forms a world broken by no loss
            return self.generations.wait_next(generation.number, self.wait_s, broke)
        except (WorldEnded, TimeoutError):
            if failure is not None:
                raise failure from None
            raise
