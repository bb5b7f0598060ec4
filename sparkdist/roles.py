"""Ranks with roles: a parameter-server job's `chief`, `worker` and `ps` ranks.

Why: in TensorFlow's ParameterServerStrategy only the chief runs the user's code (it
coordinates); `worker` and `ps` ranks run a TensorFlow server that never returns. The
runner places them like any ranks, in this order: rank 0 is the chief, the next
`worker` ranks are the workers, the last `ps` ranks the parameter servers. The roles
travel to every rank in one environment variable, so each rank can tell its own.

A lost worker is what the strategy tolerates (its coordinator runs the worker's
closures elsewhere): the job goes on while at least one worker is left. A lost chief or
parameter server fails the job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sparkdist.job_environment import ROLES as ROLES_ENV

ORDER = ("chief", "worker", "ps")
SERVERS = ("worker", "ps")
"""Roles whose ranks run a server instead of the user's function."""


@dataclass(frozen=True)
class Roles:
    """How many ranks take each role; ranks are numbered in `ORDER`."""

    chief: int
    worker: int
    ps: int

    @classmethod
    def parse(cls, value: Mapping[str, int] | str) -> Roles:
        """From `{"chief": 1, "worker": 2, "ps": 1}` or `"chief=1,worker=2,ps=1"`."""
        if isinstance(value, Roles):
            return value
        counts = _counts(value)
        unknown = sorted(set(counts) - set(ORDER))
        if unknown:
            raise ValueError(f"roles: unknown role(s) {unknown}; the roles are {list(ORDER)}")
        for role, count in counts.items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError(f"roles: the count of {role!r} must be an int >= 0, got {count!r}")
        roles = cls(**{role: counts.get(role, 0) for role in ORDER})
        if roles.chief != 1:
            raise ValueError(
                f"roles: a parameter-server job has exactly one chief (it runs your function "
                f"and coordinates), got chief={roles.chief}"
            )
        if roles.ps < 1:
            raise ValueError(
                "roles: no 'ps' role: a parameter-server job needs at least one parameter "
                "server, e.g. roles={'chief': 1, 'worker': 2, 'ps': 1}"
            )
        if roles.worker < 1:
            raise ValueError(
                "roles: no 'worker' role: the chief schedules its steps on workers, so a "
                "parameter-server job needs at least one, e.g. {'chief': 1, 'worker': 2, 'ps': 1}"
            )
        return roles

    @property
    def total(self) -> int:
        return self.chief + self.worker + self.ps

    def check_ranks(self, num_ranks: int) -> None:
        if self.total != num_ranks:
            raise ValueError(
                f"roles add up to {self.total} ranks ({self.describe()}) but np gives "
                f"{num_ranks}: make np the sum of the roles"
            )

    def role_of(self, rank: int) -> tuple[str, int]:
        """Rank `rank`'s role and its index among the ranks of that role."""
        first = 0
        for role in ORDER:
            count = getattr(self, role)
            if rank < first + count:
                return role, rank - first
            first += count
        raise ValueError(f"rank {rank} is outside the job's {self.total} ranks")

    def ranks_of(self, role: str) -> list[int]:
        return [r for r in range(self.total) if self.role_of(r)[0] == role]

    def describe(self) -> str:
        return ", ".join(f"{role}={getattr(self, role)}" for role in ORDER)

    def to_env(self) -> dict[str, str]:
        return {ROLES_ENV: ",".join(f"{role}:{getattr(self, role)}" for role in ORDER)}

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Roles | None:
        text = env.get(ROLES_ENV)
        if not text:
            return None
        return cls(**{role: int(count) for role, count in (p.split(":") for p in text.split(","))})


def rank_role(env: Mapping[str, str]) -> tuple[str, int] | None:
    """This rank's role and index, from its environment; None in a job without roles."""
    roles = Roles.from_env(env)
    return roles.role_of(int(env["RANK"])) if roles else None


def _counts(value: Mapping[str, int] | str) -> dict[str, int]:
    if isinstance(value, Mapping):
        return dict(value)
    if not isinstance(value, str):
        raise ValueError(
            f"roles must be a dict such as {{'chief': 1, 'worker': 2, 'ps': 1}}, got {value!r}"
        )
    counts: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in value.split(","))):
        role, sep, count = part.partition("=")
        if not sep or not count.strip().isdigit():
            raise ValueError(f"roles: expected ROLE=COUNT such as 'worker=2', got {part!r}")
        counts[role.strip()] = int(count)
    return counts
