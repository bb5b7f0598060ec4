"""The order `make test`'s workers take the modules in (tests/module_order.py)."""

from __future__ import annotations

from pathlib import Path

import module_order

ROOT = Path(__file__).resolve().parents[1]


def test_longest_modules_go_first_and_unmeasured_ones_count_as_typical():
    durations = {"tests/a.py": 10.0, "tests/b.py": 300.0, "tests/c.py": 10.0}
    modules = ["tests/a.py", "tests/new.py", "tests/c.py", "tests/b.py"]
    assert module_order.longest_first(modules, durations) == [
        "tests/b.py",
        "tests/new.py",  # UNMEASURED_S, 30 s
        "tests/a.py",
        "tests/c.py",
    ]


def test_the_measured_durations_name_existing_modules():
    durations = module_order.load_durations()
    assert durations, "tests/module_durations.json is missing or empty"
    missing = [module for module in durations if not (ROOT / module).is_file()]
    assert missing == [], f"measure again (see tests/module_order.py): {missing}"


def test_a_run_replaces_its_modules_figures_and_keeps_the_others(tmp_path):
    class Report:
        def __init__(self, nodeid, duration):
            self.nodeid, self.duration = nodeid, duration

    path = tmp_path / "tests" / "module_durations.json"
    path.parent.mkdir()
    (tmp_path / "tests" / "kept.py").touch()
    path.write_text('{"tests/a.py": 1.0, "tests/gone.py": 9.0, "tests/kept.py": 7.0}')
    store = module_order.ModuleDurations(path)
    reports = [("tests/a.py::t1", 1.5), ("tests/a.py::t2", 2.0), ("tests/b.py::t", 4.0)]
    for nodeid, seconds in reports:
        store.pytest_runtest_logreport(Report(nodeid, seconds))
    store.pytest_sessionfinish()
    assert module_order.load_durations(path) == {
        "tests/a.py": 3.5,  # measured again
        "tests/b.py": 4.0,
        "tests/kept.py": 7.0,  # not run this time
    }
