"""The order in which `make test`'s two pytest-xdist workers take the test modules.

Each module runs whole on one worker (its module-scoped Spark sessions and clusters are
built once). The modules go longest first, by the seconds each took in a measured run
(`module_durations.json`): a worker that finishes early then takes the short modules, and
the run does not end with one worker idle while the other runs a long module it took
last. xdist's own order (most tests first) left the long few-test modules (the demo, the
notebooks, the stalled clusters) for the end.

To measure again: `pytest tests -n 2 --ignore=tests/cluster --store-durations`. A module
not in the file counts as `UNMEASURED_S`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DURATIONS = Path(__file__).with_name("module_durations.json")
UNMEASURED_S = 30.0


def module_of(nodeid: str) -> str:
    """A test's module, the unit one worker runs whole."""
    return nodeid.split("::", 1)[0]


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    """Seconds per module, from the last measured run (none if the file is absent)."""
    return json.loads(path.read_text()) if path.exists() else {}


def longest_first(modules: list[str], durations: dict[str, float]) -> list[str]:
    """`modules`, the longest first (ties keep their order)."""
    return sorted(modules, key=lambda module: -durations.get(module, UNMEASURED_S))


class ModuleDurations:
    """With `--store-durations`: sums each module's setup, call and teardown seconds as
    the reports come in (on the controller, where xdist hands every worker's reports),
    and writes them at the end."""

    def __init__(self, path: Path = DURATIONS) -> None:
        self.path = path
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: Any) -> None:
        module = module_of(report.nodeid)
        self.seconds[module] = self.seconds.get(module, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        """The modules this run measured replace their old figures; the others stay, but
        for those whose file is gone (paths are relative to the tests' parent folder)."""
        root = self.path.parent.parent
        kept = {m: s for m, s in load_durations(self.path).items() if (root / m).is_file()}
        kept.update({module: round(s, 1) for module, s in self.seconds.items()})
        self.path.write_text(json.dumps(dict(sorted(kept.items())), indent=1) + "\n")


def scheduler(config: Any, log: Any) -> Any:
    """xdist's scheduling by scope, with the module as the scope, longest modules first."""
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return module_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not self._ordered:  # the queue is complete once the first unit is taken
                self._ordered = True
                units = dict(self.workqueue)
                self.workqueue.clear()
                for module in longest_first(list(units), load_durations()):
                    self.workqueue[module] = units[module]
            super()._assign_work_unit(node)

    return ByModule(config, log)
