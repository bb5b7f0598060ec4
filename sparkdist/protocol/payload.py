"""Preflight on the driver: turn `main` and its arguments into bytes, or say why not.

Pickling fails late and cryptically if left to the ranks; doing it first, on the
driver, lets the error name the very object that cannot travel.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import cloudpickle

from sparkdist.errors import PayloadError

logger = logging.getLogger(__name__)

_ADVICE = (
    "Objects such as locks, open files, sockets, a SparkSession/SparkContext or a "
    "DataFrame's internals cannot be sent to the ranks. Create them inside the function "
    "(and import the modules that provide them inside the function), or pass plain data."
)


def global_names(fn: Callable) -> set[str]:
    """The global names `fn` reads or writes (as HorovodRunner logs them)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return set()
    names: set[str] = set()
    stack = [code]
    while stack:
        current = stack.pop()
        names.update(n for n in current.co_names if n in getattr(fn, "__globals__", {}))
        stack.extend(c for c in current.co_consts if inspect.iscode(c))
    return names


def _referenced_objects(fn: Callable) -> list[tuple[str, Any]]:
    """The globals and closure cells `fn` carries with it, by name."""
    if not inspect.isfunction(fn):
        return []
    found = []
    try:
        closure = inspect.getclosurevars(fn)
    except (TypeError, ValueError):
        return []
    found += [(f"global '{k}'", v) for k, v in closure.globals.items()]
    found += [(f"closure variable '{k}'", v) for k, v in closure.nonlocals.items()]
    return found


def _culprit(candidates: list[tuple[str, Any]]) -> tuple[str, Any, Exception] | None:
    for label, value in candidates:
        try:
            cloudpickle.dumps(value)
        except Exception as exc:  # noqa: BLE001 - any pickling failure is the answer
            return label, value, exc
    return None


def pack(main: Callable, kwargs: dict[str, Any]) -> bytes:
    """Cloudpickle `(main, kwargs)`; raise `PayloadError` naming what cannot be pickled."""
    if not callable(main):
        raise PayloadError(f"main must be a callable, got {type(main).__name__}")
    try:
        payload = cloudpickle.dumps((main, kwargs))
    except Exception as exc:  # noqa: BLE001
        candidates = [(f"keyword argument '{k}'", v) for k, v in kwargs.items()]
        candidates += _referenced_objects(main)
        culprit = _culprit(candidates)
        if culprit is None:
            raise PayloadError(
                f"cannot pickle the function {_name(main)} or its arguments: {exc}. {_ADVICE}"
            ) from exc
        label, value, inner = culprit
        raise PayloadError(
            f"cannot pickle {label} of {_name(main)} (a {type(value).__module__}."
            f"{type(value).__qualname__}): {inner}. {_ADVICE}"
        ) from exc
    logger.info("The pickled object size is %d bytes.", len(payload))
    names = sorted(global_names(main))
    if names:
        logger.info("The global names read or written to by the pickled function are %s.", names)
    return payload


def _name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def driver_pythonpath() -> str:
    """The driver's own import path (PYTHONPATH and sys.path), minus its Python
    installation, so ranks can import the driver's modules (a function defined in a
    module is pickled by reference) without shadowing the executors' packages."""
    install = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep) + sys.path
    keep = []
    for entry in entries:
        real = os.path.realpath(entry or os.getcwd())
        if any(real == p or real.startswith(p + os.sep) for p in install):
            continue
        if "site-packages" in real or "dist-packages" in real or not os.path.isdir(real):
            continue
        if real not in keep:
            keep.append(real)
    return os.pathsep.join(keep)
