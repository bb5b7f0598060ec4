"""The shape of sparkdist's code, for one checkout or two side by side.

    python benchmarks/code_structure.py                     # this checkout
    python benchmarks/code_structure.py BEFORE AFTER        # two checkouts, in columns

For each checkout (a directory holding `sparkdist/`): modules and lines per package, the
10 longest classes and functions (lines from `def`/`class` to their last line, by `ast`),
and the import cycles between modules (grimp's graph of the checkout, built in a child
process so that two checkouts of one package do not meet in one interpreter).
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path

PACKAGE = "sparkdist"
TOP = 10

# Run in a child process with the checkout first on sys.path: grimp imports nothing, but
# it finds the package through sys.path.
_CYCLES = """
import json, sys
import grimp
graph = grimp.build_graph("sparkdist", cache_dir=None)
modules = sorted(graph.modules)
index = {m: i for i, m in enumerate(modules)}
edges = {m: graph.find_modules_directly_imported_by(m) for m in modules}
# Tarjan's strongly connected components: every component of more than one module (or a
# module importing itself) is a knot of cycles.
sys.setrecursionlimit(10000)
counter, stack, on_stack, low, number, components = [0], [], set(), {}, {}, []
def visit(m):
    number[m] = low[m] = counter[0]; counter[0] += 1
    stack.append(m); on_stack.add(m)
    for n in edges[m]:
        if n not in number:
            visit(n); low[m] = min(low[m], low[n])
        elif n in on_stack:
            low[m] = min(low[m], number[n])
    if low[m] == number[m]:
        component = []
        while True:
            n = stack.pop(); on_stack.discard(n); component.append(n)
            if n == m:
                break
        if len(component) > 1:
            components.append(sorted(component))
for m in modules:
    if m not in number:
        visit(m)
pairs = sorted(
    (a, b) for a in modules for b in edges[a] if a < b and a in edges.get(b, ())
)
print(json.dumps({"components": components, "pairs": pairs}))
"""


def _package_of(relative: Path) -> str:
    """`sparkdist/runner/driver/job.py` -> `runner/driver`; top-level modules -> `(top)`."""
    parent = relative.parent.relative_to(PACKAGE).as_posix()
    return parent if parent != "." else "(top)"


def measure(checkout: Path) -> dict:
    root = checkout / PACKAGE
    if not root.is_dir():
        raise SystemExit(f"{checkout} has no {PACKAGE}/ directory: give a sparkdist checkout")
    packages: dict[str, list[int]] = {}
    longest: list[tuple[int, str, str]] = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(checkout)
        text = path.read_text()
        modules_lines = packages.setdefault(_package_of(relative), [0, 0])
        modules_lines[0] += 1
        modules_lines[1] += len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                kind = "class" if isinstance(node, ast.ClassDef) else "def"
                where = f"{relative.relative_to(PACKAGE).as_posix()}:{node.name}"
                longest.append((node.end_lineno - node.lineno + 1, kind, where))
    cycles = subprocess.run(
        [sys.executable, "-c", _CYCLES],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(checkout), "PATH": "/usr/bin:/bin"},
        cwd=checkout,
    )
    found = json.loads(cycles.stdout)
    return {
        "packages": packages,
        "classes": sorted((x for x in longest if x[1] == "class"), reverse=True)[:TOP],
        "functions": sorted((x for x in longest if x[1] == "def"), reverse=True)[:TOP],
        "components": found["components"],
        "pairs": found["pairs"],
    }


def _table(title: str, headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    print(f"\n{title}")
    for row in [headers, ["-" * w for w in widths], *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def report(names: list[str], results: list[dict]) -> None:
    all_packages = sorted({p for r in results for p in r["packages"]})
    rows = []
    for package in all_packages:
        row = [package]
        for r in results:
            modules, lines = r["packages"].get(package, (0, 0))
            row += [str(modules) if modules else "-", str(lines) if lines else "-"]
        rows.append(row)
    totals = ["total"]
    for r in results:
        totals += [
            str(sum(m for m, _ in r["packages"].values())),
            str(sum(n for _, n in r["packages"].values())),
        ]
    rows.append(totals)
    headers = ["package"] + [f"{h} {n}" for n in names for h in ("modules", "lines")]
    _table("Modules and lines per package", headers, rows)
    for key, title in (("classes", "classes"), ("functions", "functions and methods")):
        rows = []
        for i in range(TOP):
            row = [str(i + 1)]
            for r in results:
                entries = r[key]
                row += [str(entries[i][0]), entries[i][2]] if i < len(entries) else ["", ""]
            rows.append(row)
        headers = ["#"] + [f"{h} {n}" for n in names for h in ("lines", "where")]
        _table(f"The {TOP} longest {title}", headers, rows)
    rows = [
        ["modules in a cycle"] + [str(sum(len(c) for c in r["components"])) for r in results],
        ["knots (strongly connected groups)"] + [str(len(r["components"])) for r in results],
        ["module pairs importing each other"] + [str(len(r["pairs"])) for r in results],
    ]
    _table("Import cycles between modules (grimp)", ["", *names], rows)
    for name, r in zip(names, results, strict=True):
        for component in r["components"]:
            print(f"  {name}: " + " <-> ".join(m.removeprefix(PACKAGE + ".") for m in component))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "checkouts",
        nargs="*",
        type=Path,
        help="directories holding sparkdist/ (default: this checkout); two or more print "
        "side by side",
    )
    args = parser.parse_args(argv)
    checkouts = args.checkouts or [Path(__file__).resolve().parent.parent]
    names = [c.resolve().name for c in checkouts]
    if len(set(names)) < len(names):
        names = [str(c) for c in checkouts]
    report(names, [measure(c.resolve()) for c in checkouts])


if __name__ == "__main__":
    main()
