"""Run a function right after a module is imported, at no cost until then.

Why: some preparation is only worth doing when the user's code actually uses a
framework (start Horovod's rendezvous server, fix Keras), and must happen before that
code can use it. A meta-path finder that answers only for one module name, and wraps
the real loader of that module, does exactly that; every other import passes it by with
one string comparison.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType


class _AfterLoader(importlib.abc.Loader):
    """The module's own loader, then the finder's callbacks."""

    def __init__(self, loader, finder: AfterImportFinder):
        self._loader = loader
        self._finder = finder

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._finder.loaded(module)

    def __getattr__(self, name):  # get_source, is_package, ... of the real loader
        return getattr(self._loader, name)


class AfterImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself; gives `name`'s spec a loader that calls back after loading."""

    def __init__(self, name: str):
        self.name = name
        self.callbacks: list[Callable[[ModuleType], None]] = []

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or not self.callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, AfterImportFinder):
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None:
            # A lookup alone (importlib.util.find_spec) loads nothing and calls nothing.
            spec.loader = _AfterLoader(spec.loader, self)
        return spec

    def loaded(self, module: ModuleType) -> None:
        """The module was executed: run the callbacks, once, and step aside."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            callback(module)


def after_import(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call `callback(module)` once `name` is imported (now, if it already is)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    for finder in sys.meta_path:
        if isinstance(finder, AfterImportFinder) and finder.name == name:
            finder.callbacks.append(callback)
            return
    finder = AfterImportFinder(name)
    finder.callbacks.append(callback)
    sys.meta_path.insert(0, finder)


class _RefusingLoader(importlib.abc.Loader):
    """A loader whose module fails to import with a given message."""

    def __init__(self, message: str):
        self.message = message

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise ImportError(self.message, name=module.__name__)


def refusing_spec(name: str, message: str) -> importlib.machinery.ModuleSpec:
    """A spec for `name` whose import raises ImportError(message). Returned from a
    finder (rather than raising there) so that `importlib.util.find_spec` probes still
    answer as usual and only real imports fail."""
    return importlib.machinery.ModuleSpec(name, _RefusingLoader(message))
