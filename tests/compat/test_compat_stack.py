"""The environment is the runtime's stack: what its file pins is what is imported, and the
code under test is this checkout's."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

from conftest import ROOT, runtime_python, runtime_requirements
from packaging.specifiers import SpecifierSet


def test_runtime_python_and_pins_are_installed():
    assert f"{sys.version_info.major}.{sys.version_info.minor}" == runtime_python()
    pinned = {name: pin for name, pin in runtime_requirements().items() if pin}
    installed = {name: importlib.metadata.version(name) for name in pinned}
    changed = {
        name: version
        for name, version in installed.items()
        if version not in SpecifierSet(f"=={pinned[name]}")  # 2.13.0+cpu is 2.13.0
    }
    assert not changed, f"installing sparkdist changed the runtime's own packages: {changed}"
    import sparkdist

    assert Path(sparkdist.__file__).resolve().is_relative_to(ROOT)
