"""`make test`'s xdist scheduler (`module_order.scheduler`, `ByModule`) keeps each module
whole on one worker. It overrides xdist internals (`LoadScopeScheduling._split_scope`,
`_assign_work_unit`): a toy suite runs under `pytest -n 2` in a child process, through the
same hook as tests/conftest.py, and every module's tests must have run on one worker (an
xdist that no longer calls the hook, or splits the scope its own way, spreads them)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent
MODULES, TESTS_PER_MODULE = 4, 6

CONFTEST = f"""
import sys

sys.path.insert(0, {str(TESTS)!r})
import module_order


def pytest_xdist_make_scheduler(config, log):
    return module_order.scheduler(config, log)
"""

MODULE = """
import os
import pytest


@pytest.mark.parametrize("case", range({count}))
def test_case(case):
    worker = os.environ["PYTEST_XDIST_WORKER"]
    open(os.path.join({ran!r}, f"{{__name__}}-{{case}}-{{worker}}"), "w").close()
"""


def test_each_module_of_a_toy_suite_runs_whole_on_one_worker(tmp_path):
    suite, ran = tmp_path / "suite", tmp_path / "ran"
    suite.mkdir()
    ran.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")
    (suite / "conftest.py").write_text(CONFTEST)
    for index in range(MODULES):
        text = MODULE.format(count=TESTS_PER_MODULE, ran=str(ran))
        (suite / f"test_toy_{index}.py").write_text(text)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:randomly", "-p", "no:cacheprovider"]
        + ["-q", str(suite)],
        cwd=suite,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    workers: dict[str, set[str]] = defaultdict(set)
    for name in os.listdir(ran):
        module, _, worker = name.split("-")
        workers[module].add(worker)
    assert len(os.listdir(ran)) == MODULES * TESTS_PER_MODULE, sorted(os.listdir(ran))
    assert sorted(workers) == [f"test_toy_{index}" for index in range(MODULES)]
    split = {module: sorted(seen) for module, seen in workers.items() if len(seen) > 1}
    assert split == {}, f"modules whose tests ran on several workers: {split}"
    # Both workers took modules: the grouping is not one worker running everything.
    assert len(set().union(*workers.values())) == 2, dict(workers)
