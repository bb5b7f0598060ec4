"""Data shared with trials, on both kinds of session: `share(value)` returns a small
handle; a trial reads `handle.value`.

A Spark Connect session has no broadcast variables, and a large value pickled into the
objective would travel with every trial. The handle pickles as its key only; the value
stays on the driver (pickled once, on first request) and a trial fetches it from the
search's trial service over the authenticated channel, once per executor process (Spark
reuses its Python workers, and a single-node worker runs many trials), then reads it from
that process's cache.
"""

from __future__ import annotations

import functools
import pickle
import threading
import uuid
import weakref
from collections import OrderedDict
from typing import Any, Generic, TypeVar

import cloudpickle

from sparkdist.errors import ConnectUnsupportedError, PayloadError
from sparkdist.protocol import messages, payload, wire
from sparkdist.tune.messages import FetchShared

T = TypeVar("T")

CACHE_SIZE = 8
"""Values kept per executor process (the most recently read ones)."""

HINT = (
    "To share data with trials on either kind of session, use "
    "`data = sparkdist.tune.share(value)` on the driver and `data.value` in the objective "
    "(a Spark Connect session has no SparkContext or broadcast variables)."
)

# Driver side: the live handles by key (a handle dropped by its owner is forgotten).
_HANDLES: weakref.WeakValueDictionary[str, Shared] = weakref.WeakValueDictionary()
# Executor side: where to fetch from, and what was fetched.
_SOURCE: tuple[tuple[str, int], bytes] | None = None
_CACHE: OrderedDict[str, Any] = OrderedDict()
_LOCK = threading.Lock()


class Shared(Generic[T]):
    """A value on the driver that trials read with `.value`; see `share`."""

    def __init__(self, value: T):
        self.key = uuid.uuid4().hex
        self._value = value
        self._blob: bytes | None = None
        self._blob_lock = threading.Lock()
        _HANDLES[self.key] = self

    def __getstate__(self) -> dict[str, Any]:
        return {"key": self.key}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.key = state["key"]

    def __repr__(self) -> str:
        return f"sparkdist.tune.Shared({self.key[:8]})"

    @property
    def value(self) -> T:
        """The value: the driver's own object on the driver, a cached copy elsewhere."""
        owner = self if "_value" in self.__dict__ else _HANDLES.get(self.key)
        if owner is not None:  # on the driver
            return owner._value
        return _fetch(self.key)

    def blob(self) -> bytes:
        """The value pickled, once (for the trial service)."""
        with self._blob_lock:
            if self._blob is None:
                self._blob = cloudpickle.dumps(self._value)
            return self._blob


def share(value: T) -> Shared[T]:
    """Share `value` with the trials of `sparkdist.tune.optimize` (a dataset, a lookup
    table): the objective reads `handle.value`, fetched once per executor process.

    Keep the handle (the objective that uses it does) while searches use it.
    """
    return Shared(value)


def blob_for(key: str) -> bytes:
    """The pickled value of a live handle (raises `KeyError` if it is gone)."""
    handle = _HANDLES.get(key)
    if handle is None:
        raise KeyError(f"sparkdist.tune: no shared value {key[:8]} on the driver (dropped?)")
    return handle.blob()


def serve_from(address: tuple[str, int], secret: wire.JobSecret) -> None:
    """Where this process fetches shared values: the running search's trial service."""
    global _SOURCE
    _SOURCE = (address, secret)


def _fetch(key: str) -> Any:
    with _LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
        if _SOURCE is None:
            raise RuntimeError(
                "sparkdist.tune: a shared value is read in a trial's objective (or on the "
                "driver), not outside a search"
            )
        channel = wire.connect(*_SOURCE)
        try:
            raw = channel.request(messages.encode(FetchShared(key)))
        finally:
            channel.close()
        reply = messages.reply_to(raw, (messages.Ok, messages.Failed))
        if isinstance(reply, messages.Failed):
            raise reply.error
        value = pickle.loads(reply.value)
        _CACHE[key] = value
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
        return value


def check_objective(objective: Any, kind: str, np: int | None) -> None:
    """Refuse, naming `share`, what an objective cannot use where trials run: a pyspark
    broadcast variable on a Spark Connect session or in the ranks of a distributed trial
    (which are not Spark tasks), and a Spark Connect session or DataFrame (no Connect
    session is active in a task)."""
    from sparkdist.spark import is_connect_session

    referenced = _referenced(objective)
    sessions = [name for name, value in referenced if is_connect_session(value)]
    if sessions:
        raise ConnectUnsupportedError(
            f"the objective uses {', '.join(sessions)}, a Spark Connect client object, which "
            "cannot work in the Spark task where a trial runs (no Connect session is "
            f"active there). Read the data on the driver before the search. {HINT}"
        )
    if kind != "connect" and np is None:
        return  # classic single-node trials run in Spark tasks, where broadcasts work
    try:
        from pyspark.broadcast import Broadcast
    except ImportError:  # pyspark-client (Connect only) has no broadcast variables
        return
    found = [name for name, value in referenced if isinstance(value, Broadcast)]
    if found and kind == "connect":
        raise ConnectUnsupportedError(
            f"the objective uses the pyspark broadcast variable {', '.join(found)}, which "
            f"cannot be read on a Spark Connect session. {HINT}"
        )
    if found:
        raise PayloadError(
            f"the objective uses the pyspark broadcast variable {', '.join(found)}, which "
            f"cannot be read in distributed trials (np={np}: the ranks are not Spark "
            f"tasks). {HINT}"
        )


def _referenced(fn: Any) -> list[tuple[str, Any]]:
    """The objects an objective reads: a function's closure cells and the globals it
    names; a `functools.partial`'s bound arguments and what its function reads; a
    callable object's attributes and what its `__call__` reads."""
    if isinstance(fn, functools.partial):
        bound = [(f"argument {i} of the partial", value) for i, value in enumerate(fn.args)]
        bound += [(f"argument {name}= of the partial", v) for name, v in fn.keywords.items()]
        return bound + _referenced(fn.func)
    code = getattr(fn, "__code__", None)
    if code is None:  # a callable object: its attributes, and what its __call__ reads
        attributes = getattr(fn, "__dict__", {})
        fields = [(f"attribute {name}", value) for name, value in attributes.items()]
        method = type(fn).__call__ if callable(fn) else None
        return fields + (_referenced(method) if hasattr(method, "__code__") else [])
    found = []
    for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=False):
        try:
            found.append((name, cell.cell_contents))
        except ValueError:  # an empty cell
            pass
    names = payload.global_names(fn)
    found += [(name, fn.__globals__[name]) for name in names if name in fn.__globals__]
    return found


def hint_for(traceback: str | None) -> str | None:
    """A failed trial's traceback, with `HINT` added when it failed for reaching to the
    SparkContext or a broadcast variable where there is none."""
    if traceback and (
        "JVM_ATTRIBUTE_NOT_SUPPORTED" in traceback or "Broadcast variable" in traceback
    ):
        return f"{traceback.rstrip()}\n\nsparkdist.tune: {HINT}"
    return traceback
