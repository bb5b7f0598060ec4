"""Preflight on the driver: turn `main` and its arguments into bytes, or say why not;
and, on a rank, back into `main` and its arguments.

Pickling fails late and cryptically if left to the ranks; doing it first, on the
driver, lets the error name the very object that cannot travel.

A failing rank's traceback shows the user's source lines, under every cloudpickle:
the payload keeps, for each code object pickled by value, the name of its file
(cloudpickle >= 3.1.3 writes "<dynamic-code>" instead) and that file's lines as the
driver sees them (a notebook cell or a driver-only file has no copy on the executors);
`unpack` puts the names back on the code and the lines into `linecache`, where
`traceback` reads them.
"""

from __future__ import annotations

import inspect
import io
import linecache
import logging
import os
import pickle
import sys
import types
from collections import ChainMap
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


_CLOUDPICKLE_CODE_REDUCE = cloudpickle.Pickler.dispatch_table[types.CodeType]


def _code_in_file(rebuild: Callable[..., types.CodeType], args: tuple, filename: str):
    """On a rank: a code object as cloudpickle rebuilds it, named for its own file again."""
    code = rebuild(*args)
    return code if code.co_filename == filename else code.replace(co_filename=filename)


class _SourcePickler(cloudpickle.Pickler):
    """cloudpickle's pickler that also keeps, for every code object it pickles by value,
    its file's name (in the code) and lines (in `sources`)."""

    def __init__(self, file: io.BytesIO):
        # Set before the base class's __init__, which reads it.
        self.dispatch_table = ChainMap(
            {types.CodeType: self._reduce_code}, cloudpickle.Pickler.dispatch_table
        )
        super().__init__(file)
        self.sources: dict[str, list[str]] = {}

    def _reduce_code(self, code: types.CodeType):
        filename = code.co_filename
        if filename not in self.sources:
            self.sources[filename] = linecache.getlines(filename)
        return _code_in_file, (*_CLOUDPICKLE_CODE_REDUCE(code), filename)


def _dumps(main: Callable, kwargs: dict[str, Any]) -> bytes:
    """Two pickles in one buffer: `(main, kwargs)`, then the sources its pickling found (the
    payload's bytes are not pickled again, which would copy a large payload twice)."""
    buffer = io.BytesIO()
    pickler = _SourcePickler(buffer)
    pickler.dump((main, kwargs))
    sources = {name: lines for name, lines in pickler.sources.items() if lines}
    pickle.dump(sources, buffer, protocol=pickle.HIGHEST_PROTOCOL)
    return buffer.getvalue()


def unpack(blob: bytes) -> tuple[Callable, dict[str, Any]]:
    """On a rank: the `(main, kwargs)` that `pack` made, with the driver's source lines
    of by-value code in `linecache` (mtime None: kept however the file differs here)."""
    stream = io.BytesIO(blob)
    main_and_kwargs = cloudpickle.load(stream)
    for filename, lines in pickle.load(stream).items():
        linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
    return main_and_kwargs


def pack(main: Callable, kwargs: dict[str, Any]) -> bytes:
    """Cloudpickle `(main, kwargs)` with the sources of its by-value code (`unpack` reads
    it on a rank); raise `PayloadError` naming what cannot be pickled."""
    if not callable(main):
        raise PayloadError(f"main must be a callable, got {type(main).__name__}")
    try:
        payload = _dumps(main, kwargs)
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
