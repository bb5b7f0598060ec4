"""The import hooks the backends rely on, with real modules imported from a temp dir."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

from sparkdist.backends.import_hooks import AfterImportFinder, after_import, refusing_spec


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    names: list[str] = []

    def make(name: str, source: str = "VALUE = 42\n") -> str:
        (tmp_path / f"{name}.py").write_text(source)
        names.append(name)
        return name

    yield make
    for name in names:
        sys.modules.pop(name, None)
    sys.meta_path[:] = [
        f for f in sys.meta_path if not (isinstance(f, AfterImportFinder) and f.name in names)
    ]


def test_callback_runs_once_after_import_not_on_lookup(module_dir):
    name = module_dir("sparkdist_hook_probe")
    seen = []
    after_import(name, lambda m: seen.append(m.VALUE))
    assert importlib.util.find_spec(name) is not None  # a probe loads nothing
    assert seen == []
    module = importlib.import_module(name)
    assert seen == [42] and module.VALUE == 42
    assert not any(isinstance(f, AfterImportFinder) and f.name == name for f in sys.meta_path)
    del sys.modules[name]
    importlib.import_module(name)
    assert seen == [42]


def test_callback_runs_now_when_already_imported(module_dir):
    name = module_dir("sparkdist_hook_loaded")
    importlib.import_module(name)
    seen = []
    after_import(name, lambda m: seen.append(m.__name__))
    assert seen == [name]


def test_refusing_spec_fails_imports_only(monkeypatch):
    class Refuse:
        def find_spec(self, fullname, path=None, target=None):
            if fullname == "sparkdist_refused":
                return refusing_spec(fullname, "not here, use that")
            return None

    monkeypatch.setattr(sys, "meta_path", [Refuse(), *sys.meta_path])
    assert importlib.util.find_spec("sparkdist_refused") is not None
    with pytest.raises(ImportError, match="not here, use that"):
        importlib.import_module("sparkdist_refused")
    assert "sparkdist_refused" not in sys.modules
