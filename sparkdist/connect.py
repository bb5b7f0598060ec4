"""What differs on a Spark Connect client: recognising one, and a clear error for the
few things that need a SparkContext (a JVM in this process), which Connect lacks."""

from __future__ import annotations

from typing import Any

from sparkdist.runner.errors import SparkdistError


class ConnectUnsupportedError(SparkdistError):
    """Something that needs a SparkContext was asked of a Spark Connect session."""


def is_connect_session(session: Any) -> bool:
    """Whether `session` is a Spark Connect client session (no SparkContext here)."""
    return type(session).__module__.startswith("pyspark.sql.connect")


def require_classic(session: Any, what: str, alternative: str) -> None:
    """Raise `ConnectUnsupportedError` naming `what` and `alternative` on Connect."""
    if session is not None and is_connect_session(session):
        raise ConnectUnsupportedError(
            f"{what} needs a SparkContext (Spark's JVM in this process), which a Spark "
            f"Connect session does not have. {alternative}"
        )
