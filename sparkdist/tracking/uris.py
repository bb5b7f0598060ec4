"""Tracking URIs: made absolute for other processes, and safe to write into logs."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

# Tracking URIs that MLflow reads as names, not paths.
_NAMED_URIS = ("databricks", "databricks-uc", "uc")


def default_tracking_uri() -> str:
    """The embedded default: a SQLite file ``mlflow.db`` in the working directory."""
    return f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def absolute_tracking_uri(uri: str) -> str:
    """``uri`` with a relative SQLite or file path made absolute against the cwd.

    A rank runs in another working directory than the driver, so ``sqlite:///mlflow.db``
    would otherwise name a different (empty) database there.
    """
    if uri.startswith("sqlite:///"):
        rest = uri[len("sqlite:///") :]
        if rest and not rest.startswith("/") and not rest.startswith(":memory:"):
            return "sqlite:///" + os.path.abspath(rest)
        return uri
    if uri in _NAMED_URIS:
        return uri
    parts = urlsplit(uri)
    if not parts.scheme or len(parts.scheme) == 1:  # a plain path (or a Windows drive)
        return Path(os.path.abspath(uri)).as_uri()
    if parts.scheme == "file" and not parts.netloc:
        # file:mlruns or file:./mlruns (not file:///abs)
        path = uri[len("file:") :]
        if not path.startswith("/"):
            return Path(os.path.abspath(path)).as_uri()
    return uri


def redact_uri(uri: str) -> str:
    """``uri`` without a password or token in its user-info part, for logs."""
    parts = urlsplit(uri)
    if parts.password is None and "@" not in parts.netloc:
        return uri
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:***@" if parts.username else "***@"
    return urlunsplit((parts.scheme, user + host, parts.path, parts.query, parts.fragment))
