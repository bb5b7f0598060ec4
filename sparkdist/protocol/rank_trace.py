"""A rank's half of the job's trace (`sparkdist/trace/format.py`): what happened in
this process, when, on the driver's clock.

Events are appended to a list in the process (a tuple each: no lock, no I/O) and leave
with the rank's next sign of life (`driver_channel.Steps.tell`, at most once a second),
and the rest with its result or error. Nothing is recorded outside a sparkdist rank, or
when the job records no trace (`HorovodRunner(trace=False)`).

The clock: the driver's `Welcome` says what its trace clock read when it answered the
rank's hello. Taking that to be the middle of the round trip (as NTP does) maps this
process's `time.monotonic()` to the driver's clock to within half the round trip.

On the wire an event is `(ph, lane, name, ts_us, dur_us, args)`: `ph` is "X" (a slice),
"i" (an instant), "C" (a counter) or "main" (the user's function entered).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from sparkdist.trace.format import CHECKPOINT, DATA_WAIT, EVENTS, STEPS

MAX_BUFFERED = 200_000
"""Events kept in the process while none can leave (the driver unreachable): the
oldest go first."""
DATA_WAIT_MIN_S = 1e-4
"""A loader's wait shorter than this is not recorded: handing out a ready batch takes
about that long, and it is no wait for data."""

_offset_us: float | None = None
"""Driver clock (µs) minus this process's monotonic clock (µs); None: not recording."""
_events: list[tuple] = []
_step_kind: str | None = None
_step_end: float | None = None
_step_number = 0
_nvml: Any = None


def start(driver_clock_us: float, asked_at: float, answered_at: float) -> None:
    """Record from now on: the driver's clock read `driver_clock_us` between `asked_at`
    and `answered_at` (this process's monotonic seconds). A negative clock: no trace."""
    global _offset_us, _step_kind, _step_end, _step_number
    _events.clear()
    _step_kind, _step_end, _step_number = None, None, 0
    if driver_clock_us < 0:
        _offset_us = None
        return
    _offset_us = driver_clock_us - (asked_at + answered_at) / 2 * 1e6


def recording() -> bool:
    return _offset_us is not None


def _us(monotonic_s: float) -> float:
    return monotonic_s * 1e6 + _offset_us  # type: ignore[operator]


def _add(event: tuple) -> None:
    if len(_events) >= MAX_BUFFERED:
        del _events[: MAX_BUFFERED // 10]
    _events.append(event)


def span(lane: int, name: str, start_s: float, end_s: float, args: dict | None = None) -> None:
    """A slice on `lane`, from `start_s` to `end_s` (monotonic seconds)."""
    if _offset_us is not None:
        _add(("X", lane, name, _us(start_s), (end_s - start_s) * 1e6, args))


def instant(name: str, args: dict | None = None, lane: int = EVENTS) -> None:
    if _offset_us is not None:
        _add(("i", lane, name, _us(time.monotonic()), 0.0, args))


def main_entered() -> None:
    """The user's function starts now: the end of the launch, the start of the steps."""
    global _step_end
    if _offset_us is not None:
        _step_end = time.monotonic()
        _add(("main", 0, "main", _us(_step_end), 0.0, None))


def step(kind: str, number: int | None = None) -> None:
    """A step of `kind` ("report", "commit") ended now. The first kind a rank records
    is its steps; the others are not counted again."""
    global _step_kind, _step_end, _step_number
    if _offset_us is None:
        return
    if _step_kind is None:
        _step_kind = kind
    elif kind != _step_kind:
        return
    now = time.monotonic()
    begun = _step_end if _step_end is not None else now
    _step_end = now
    number = _step_number if number is None else number
    _step_number = number + 1
    _add(("X", STEPS, f"step {number}", _us(begun), (now - begun) * 1e6, {"steps": 1}))


def data_wait(start_s: float, end_s: float) -> None:
    """The loader kept the training loop waiting from `start_s` to `end_s`."""
    if _offset_us is not None and end_s - start_s >= DATA_WAIT_MIN_S:
        _add(("X", DATA_WAIT, "data wait", _us(start_s), (end_s - start_s) * 1e6, {"waits": 1}))


def checkpoint(name: str, start_s: float, end_s: float) -> None:
    """A commit or a save took from `start_s` to `end_s`."""
    span(CHECKPOINT, name, start_s, end_s, {"count": 1})


def drain() -> list[tuple]:
    """The events recorded since the last drain, with a sample of the GPU's counters."""
    if _offset_us is None:
        return []
    _sample_gpu()
    events = _events[:]
    _events.clear()
    return events


def put_back(events: list[tuple]) -> None:
    """Events drained that could not leave: they go with the next sign of life."""
    _events[:0] = events


def _sample_gpu() -> None:
    """Memory (torch's allocator) and, where NVML answers, utilisation of this rank's
    GPU; nothing where torch has not used CUDA."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return
    now = _us(time.monotonic())
    mib = 2.0**20
    allocated, reserved = cuda.memory_allocated() / mib, cuda.memory_reserved() / mib
    _add(("C", 0, "gpu memory", now, 0.0, {"allocated_mib": allocated, "reserved_mib": reserved}))
    percent = _utilisation(cuda.current_device())
    if percent is not None:
        _add(("C", 0, "gpu utilisation", now, 0.0, {"percent": float(percent)}))


def _utilisation(device: int) -> int | None:
    """NVML's utilisation of the physical GPU behind torch's `device`; None without NVML."""
    global _nvml
    if _nvml is False:
        return None
    try:
        if _nvml is None:
            import pynvml

            pynvml.nvmlInit()
            _nvml = pynvml
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
        index = int(visible[device]) if device < len(visible) and visible[device] else device
        handle = _nvml.nvmlDeviceGetHandleByIndex(index)
        return _nvml.nvmlDeviceGetUtilizationRates(handle).gpu
    except Exception:  # noqa: BLE001 - no NVML, or a GPU it does not name: no column
        _nvml = False
        return None
