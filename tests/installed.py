"""Marks for tests that need an optional package.

Outside CI a missing package skips its tests with the command that installs it. In CI
(`CI=true`) `make test` has installed everything, so a missing package is a broken
install: the tests run and fail instead of hiding it behind a skip.
"""

from __future__ import annotations

import importlib.util
import os

import pytest


def requires(module: str, fix: str) -> pytest.MarkDecorator:
    missing = importlib.util.find_spec(module) is None and os.environ.get("CI") != "true"
    return pytest.mark.skipif(missing, reason=f"{module} is not installed: {fix}")
