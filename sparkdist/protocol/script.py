"""Running a Python script on every rank as `__main__`, with its own arguments.

The script's source is read on the driver and travels in the payload, so the
executors need not have the file.
"""

from __future__ import annotations

import linecache
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ScriptMain:
    """A callable payload that runs a script as `python SCRIPT ARGS...` would."""

    path: str
    source: str
    args: tuple[str, ...]

    @classmethod
    def from_file(cls, path: str | os.PathLike, args: Sequence[str] = ()) -> ScriptMain:
        path = os.path.abspath(os.fspath(path))
        if not os.path.isfile(path):
            raise FileNotFoundError(f"training script not found: {path}")
        if isinstance(args, str) or not all(isinstance(a, str) for a in args):
            raise ValueError("args must be a list of strings, e.g. ['--epochs', '3']")
        with open(path, encoding="utf-8") as f:
            source = f.read()
        compile(source, path, "exec")  # a syntax error shows here, on the driver
        return cls(path, source, tuple(args))

    def __call__(self) -> None:
        # Tracebacks show the script's lines even where the file does not exist.
        linecache.cache[self.path] = (
            len(self.source),
            None,
            self.source.splitlines(True),
            self.path,
        )
        sys.argv = [self.path, *self.args]
        sys.path.insert(0, os.path.dirname(self.path))
        namespace = {"__name__": "__main__", "__file__": self.path, "__builtins__": __builtins__}
        exec(compile(self.source, self.path, "exec"), namespace)
