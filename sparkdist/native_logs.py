"""C++ start-up logs of TensorFlow (and the absl-based libraries it carries) in ranks.

Why: every rank that imports TensorFlow prints INFO and WARNING lines from C++ that ask
nothing of the user (oneDNN's "custom operations are on", CPU feature notes, absl's
"All log messages before absl::InitializeLog() ..."), once per rank and per library.
They are off by default: TF_CPP_MIN_LOG_LEVEL=2 (errors only) when the user has not
set it. TensorFlow's own logger reads that variable; the parts of TensorFlow built on
absl logging (and each library with its own copy of absl) do not, and absl reads no
variable at all, so a rank's stderr lines in absl's format (`I0000 00:00:... file:line]`)
below that level are left out of the stream sent home as well. The variable turns
them back on: TF_CPP_MIN_LOG_LEVEL=0 shows everything, 1 adds warnings.

Kept free of framework imports: a rank's supervisor uses it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, MutableMapping

LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
DEFAULT_LEVEL = "2"
"""Errors only (0: all, 1: warnings and errors, 3: fatal only), as TensorFlow counts."""

_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}
# absl/glog's prefix: severity, MMDD hh:mm:ss.micros (seconds since the epoch before
# absl is initialised), thread id, C++ source file:line] (absl-py, Python's, has .py).
_ABSL_LINE = re.compile(
    r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [^\s\]]+\.(?:cc|cpp|cxx|c|h|hpp|cu):\d+\] "
)
# Printed (as a warning) by absl before the first message of each copy of absl.
_ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written"


def min_level(env: Mapping[str, str]) -> int:
    """The level below which C++ log lines are off: the user's TF_CPP_MIN_LOG_LEVEL,
    else the default."""
    value = env.get(LEVEL_VARIABLE, DEFAULT_LEVEL).strip()
    return int(value) if value.isdigit() else 0


def set_default_level(env: MutableMapping[str, str]) -> None:
    """Set TF_CPP_MIN_LOG_LEVEL in a rank's environment unless the user did."""
    env.setdefault(LEVEL_VARIABLE, DEFAULT_LEVEL)


def below_level(env: Mapping[str, str]) -> Callable[[str], bool]:
    """A test for one stderr line of a rank: is it an absl-format C++ log line (or
    absl's start-up notice) below the rank's level?"""
    level = min_level(env)

    def hidden(line: str) -> bool:
        if level == 0:
            return False
        match = _ABSL_LINE.match(line)
        if match:
            return _SEVERITY[match.group(1)] < level
        return level > _SEVERITY["W"] and line.startswith(_ABSL_NOTICE)

    return hidden
