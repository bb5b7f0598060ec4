"""Progress shown while a user waits: one small display for every part of sparkdist.

    from sparkdist import progress

    with progress.bar(total=8, desc="sparkdist tune", unit="trial") as bar:
        bar.update(1, best=0.93)

Where it shows (`mode()`): a notebook gets tqdm's widget when ipywidgets is installed
(tqdm's text bar otherwise), a terminal tqdm's bar on stderr, anything else (a log
file, a pipe, CI) plain log lines on the `sparkdist.progress` logger, at most one every
`LINE_INTERVAL_S` seconds plus the last. Nothing shows when the `sparkdist` logger is
set above INFO (`sparkdist.set_log_level("WARNING")`, `SPARKDIST_LOG_LEVEL=WARNING`)
or with `SPARKDIST_PROGRESS=0`; the `sparkdist.progress` logger's own level, when set,
decides for progress alone (the `sparkdist` command keeps progress at INFO while its
other lines are at WARNING).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any

from sparkdist import job_environment

logger = logging.getLogger(__name__)

PROGRESS_ENV = job_environment.PROGRESS
"""0 hides progress displays (log lines stay)."""
LINE_INTERVAL_S = 10.0
"""Plain-line mode: the least time between two lines of one display."""
REFRESH_S = 0.5
"""Bars: the least time between two redraws (tqdm's mininterval)."""


def mode() -> str:
    """ "off", "notebook", "terminal" or "lines": how progress shows here, now."""
    if os.environ.get(PROGRESS_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return "off"
    if not logger.isEnabledFor(logging.INFO):
        return "off"
    if _in_notebook():
        return "notebook"
    isatty = getattr(sys.stderr, "isatty", None)
    return "terminal" if isatty is not None and isatty() else "lines"


def _in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    ipython = shell.get_ipython()
    return ipython is not None and hasattr(ipython, "kernel")


class Bar:
    """One progress display: a count of `total` (or open-ended) and a few named values."""

    def __init__(self, total: int | None, desc: str, unit: str = "it"):
        self.total, self.desc, self.unit = total, desc, unit
        self.count = 0
        self.postfix: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._mode = mode()
        self._tqdm = None
        self._last_line = 0.0
        self._line_pending = False
        if self._mode in ("notebook", "terminal"):
            # tqdm writes an open-ended count and its unit together ("3reports").
            shown_unit = unit if total is not None else f" {unit}"
            self._tqdm = _tqdm_class(self._mode)(
                total=total,
                desc=desc,
                unit=shown_unit,
                mininterval=REFRESH_S,
                file=sys.stderr,
                dynamic_ncols=True,
                leave=True,
            )

    def update(self, n: int = 1, **postfix: Any) -> None:
        """`n` more done; `postfix` values shown after the count (e.g. best=0.9)."""
        self.set(self.count + n, **postfix)

    def set(self, count: int, **postfix: Any) -> None:
        """`count` done in all; `postfix` as in `update`."""
        with self._lock:
            step = count - self.count
            self.count = count
            self.postfix.update(postfix)
            if self._tqdm is not None:
                if postfix:
                    self._tqdm.set_postfix(self._shown(), refresh=False)
                self._tqdm.update(step)
            elif self._mode == "lines":
                self._line_pending = True
                now = time.monotonic()
                if now - self._last_line >= LINE_INTERVAL_S or count == self.total:
                    self._write_line(now)

    def total_now(self, total: int) -> None:
        """The total became known, or changed (e.g. a Spark job's tasks)."""
        with self._lock:
            if total == self.total:
                return
            self.total = total
            if self._tqdm is not None:
                self._tqdm.total = total
                self._tqdm.refresh()

    def close(self) -> None:
        with self._lock:
            if self._tqdm is not None:
                self._tqdm.close()
                self._tqdm = None
            elif self._mode == "lines" and self._line_pending:
                self._write_line(time.monotonic())

    def _write_line(self, now: float) -> None:
        self._last_line, self._line_pending = now, False
        count = f"{self.count}/{self.total}" if self.total is not None else str(self.count)
        extra = " ".join(f"{k}={v}" for k, v in self._shown().items())
        logger.info("%s: %s %s%s", self.desc, count, self.unit, f" ({extra})" if extra else "")

    def _shown(self) -> dict[str, str]:
        return {k: f"{v:.4g}" if isinstance(v, float) else str(v) for k, v in self.postfix.items()}

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def bar(total: int | None, desc: str, unit: str = "it") -> Bar:
    """A progress display for `total` things (None: open-ended); use it with `with`."""
    return Bar(total, desc, unit)


def _tqdm_class(where: str):
    if where == "notebook":
        try:
            import ipywidgets  # noqa: F401 - tqdm's widget needs it
            from tqdm.notebook import tqdm

            return tqdm
        except ImportError:
            pass
    from tqdm.std import tqdm

    return tqdm
