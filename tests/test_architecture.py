"""docs/architecture.md stays true: its module table names every module, and only modules
that exist."""

import ast
import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"


def _table_modules() -> set[str]:
    text = DOC.read_text()
    section = text.split("## Which module runs where", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert len(rows) > 10, "the module table is missing from docs/architecture.md"
    return {m for row in rows for m in re.findall(r"`(sparkdist/[\w/]+\.py)`", row)}


def _package_modules() -> set[str]:
    found = set()
    for path in (ROOT / "sparkdist").rglob("*.py"):
        relative = path.relative_to(ROOT).as_posix()
        if path.name in ("__init__.py", "__main__.py") or "/demos/" in relative:
            continue
        found.add(relative)
    return found


def test_every_listed_module_exists():
    missing = sorted(m for m in _table_modules() if not (ROOT / m).is_file())
    assert not missing, f"docs/architecture.md lists modules that do not exist: {missing}"


def test_every_module_is_listed():
    unlisted = sorted(_package_modules() - _table_modules())
    assert not unlisted, f"modules missing from docs/architecture.md's table: {unlisted}"


def test_backticked_paths_in_the_doc_exist():
    """Paths the prose names (e.g. `runner/driver/job.py`) point at real files."""
    text = DOC.read_text()
    named = set(
        re.findall(r"`((?:runner|spark|tune|ensemble|data|tracking|backends)/[\w/]+\.py)", text)
    )
    missing = sorted(p for p in named if not (ROOT / "sparkdist" / p).is_file())
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"


def _layered_names() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    return {name.strip() for layer in layers for name in re.split(r"[|:]", layer)}


def test_every_top_level_module_is_in_a_layer():
    """The import contracts (pyproject.toml, checked by `lint-imports` in `make test`) cover
    every package and module of sparkdist: a new one must be given its layer."""
    top = {
        path.stem if path.suffix == ".py" else path.name
        for path in (ROOT / "sparkdist").iterdir()
        if (path.suffix == ".py" and path.name != "__init__.py") or (path / "__init__.py").is_file()
    }
    unplaced = sorted(top - _layered_names())
    assert not unplaced, f"sparkdist modules in no layer of pyproject.toml: {unplaced}"


def test_the_spark_internals_contract_reads_import_lines():
    from import_contracts import _imported_names

    assert _imported_names("from pyspark import BarrierTaskContext, TaskContext as T") == [
        "pyspark",
        "pyspark.BarrierTaskContext",
        "pyspark.TaskContext",
    ]
    assert _imported_names("import pyspark.sql.connect.plan as plan") == [
        "pyspark.sql.connect.plan"
    ]


def test_environment_names_are_spelled_in_job_environment_only():
    """Every `SPARKDIST_*` variable name in the code is a constant of job_environment.py
    (prose in docstrings and messages may name them)."""
    spelled = set()
    for path in (ROOT / "sparkdist").rglob("*.py"):
        relative = path.relative_to(ROOT).as_posix()
        if relative == "sparkdist/job_environment.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if re.fullmatch(r"SPARKDIST_[A-Z0-9_]+", node.value):
                    spelled.add((relative, node.value))
    assert spelled == set(), "name these in sparkdist/job_environment.py"


def test_no_long_class_or_function_in_the_runner():
    """Issue 30's limits: a runner class over 200 lines or a function over 60 is split."""
    limits = {ast.ClassDef: 200, ast.FunctionDef: 60, ast.AsyncFunctionDef: 60}
    too_long = []
    for path in sorted((ROOT / "sparkdist" / "runner").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            limit = limits.get(type(node))
            length = node.end_lineno - node.lineno + 1 if limit else 0
            if limit and length > limit:
                where = path.relative_to(ROOT).as_posix()
                too_long.append(f"{where}:{node.lineno} {node.name}: {length} lines > {limit}")
    assert not too_long, "\n".join(too_long)
