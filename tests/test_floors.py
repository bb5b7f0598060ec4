"""Our dependency floors are the runtimes' own: each `install_requires` floor in setup.py is
the lowest version that the runtime matrix (requirements/runtimes/*.txt) pins, so installing
sparkdist on a supported runtime upgrades nothing the runtime ships. Pure Python: the files
are read, not installed (`make runtimes` installs them, and fails on a floor above a pin)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
RUNTIME_FILES = sorted((ROOT / "requirements" / "runtimes").glob("*.txt"))
# What every runtime's file pins (issue 39): the stack under sparkdist.
STACK = {"pyspark", "numpy", "pandas", "pyarrow", "cloudpickle", "scikit-learn", "mlflow-skinny"}


def floored_requirements() -> list[Requirement]:
    """setup.py's install_requires, and the requirements of its extras on a package the
    matrix pins (scikit-learn), read from its source (setup.py is not run)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    found: list[Requirement] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "install_requires":
            found += [Requirement(text) for text in ast.literal_eval(node.value)]
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "EXTRAS":
            extras = ast.literal_eval(node.value)
            found += [
                Requirement(text)
                for requirements in extras.values()
                for text in requirements
                if Requirement(text).name in STACK
            ]
    assert any(r.name == "pyspark" for r in found), "setup.py has no install_requires=[...]"
    return found


def runtime(path: Path) -> tuple[str, dict[str, str | None]]:
    """(Python X.Y, {package: pinned version, or None where the file leaves it unpinned})."""
    text = path.read_text()
    python = re.search(r"^# python: (\d+\.\d+)$", text, re.M)
    assert python, f"{path.name} names no interpreter ('# python: X.Y')"
    pins: dict[str, str | None] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            match = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:==([0-9][0-9A-Za-z.+-]*))?", line)
            assert match, f"{path.name}: {line!r} is neither 'name==version' nor 'name'"
            pins[match.group(1).lower()] = match.group(2)
    return python.group(1), pins


RUNTIMES = {path.stem: runtime(path) for path in RUNTIME_FILES}


def test_the_matrix_has_the_supported_runtimes():
    assert set(RUNTIMES) == {"dbr-14.3", "dbr-15.4", "dbr-16.4", "dbr-17.3", "latest"}
    for name, (_, pins) in RUNTIMES.items():
        assert STACK <= set(pins), f"{name} leaves out {sorted(STACK - set(pins))}"
        if name != "latest":  # "latest" is the newest of everything: nothing pinned
            assert all(pins[package] for package in STACK), f"{name} must pin {STACK}"


@pytest.mark.parametrize("requirement", floored_requirements(), ids=str)
def test_floor_is_the_lowest_version_the_runtimes_pin(requirement):
    floors = [spec for spec in requirement.specifier if spec.operator == ">="]
    assert len(floors) == 1, f"{requirement}: one '>=' floor, no other bound"
    assert len(requirement.specifier) == 1, f"{requirement}: a floor only, no upper bound"
    applies = {
        name: pins
        for name, (python, pins) in RUNTIMES.items()
        if requirement.marker is None or requirement.marker.evaluate({"python_version": python})
    }
    pinned = {name: pins.get(requirement.name) for name, pins in applies.items()}
    missing = [name for name, version in pinned.items() if name != "latest" and not version]
    assert not missing, f"{requirement.name} is not pinned in {missing}: the floor has no basis"
    lowest = min(Version(version) for version in pinned.values() if version)
    assert Version(floors[0].version) == lowest, (
        f"{requirement}: the lowest {requirement.name} of the runtimes it applies to is "
        f"{lowest} ({ {n: v for n, v in pinned.items() if v} })"
    )
