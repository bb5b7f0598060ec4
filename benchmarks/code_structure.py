"""The shape of sparkdist's code, for one checkout or two side by side.

    python benchmarks/code_structure.py                     # this checkout
    python benchmarks/code_structure.py BEFORE AFTER        # two checkouts, in columns

For each checkout (a directory holding `sparkdist/`): modules and lines per package, the
10 longest classes and functions (lines from `def`/`class` to their last line, by `ast`),
the import cycles between modules and the modules imported by exactly one other module
(grimp's graph of the checkout, built in a child process so that two checkouts of one
package do not meet in one interpreter), and the walks.

A walk is one operation run for real through sparkdist's public API, in a child process
per checkout (local Spark, `local[2]`), traced in that process (the driver's) with
`sys.setprofile`: a *stop* is a call into a sparkdist module from another module (or from
outside sparkdist), a *return* a stop into a module the walk had already visited and
left for another (the stop before it went elsewhere: two calls in a row into one helper
module, say `fs`, leave nothing). Left out: what a module runs while it is imported, what
logging's handlers run for a log record (sparkdist's console handler: its stops count log
lines), and the time-driven watcher threads (progress displays: their stops count
seconds). The walks:

* a job's options: `HorovodRunner(np=2, ...)` and `run(main)`, up to the call of the chosen
  launch kind's `form` (the first thread a job starts, if no `form` comes first);
* a DataFrame's way to a rank: `make_spark_converter(df)` of a Parquet scan (read in place)
  and of a computed DataFrame (copied once), then a rank's read of the first
  (`make_torch_dataloader`, one epoch, rank 0 of 2, in this process);
* the ensemble's fit: `PartitionEnsemble(...).fit(df)` (the driver's side; its tasks run in
  Spark's workers);
* a checkpoint commit: an `np=-1` job whose `main` calls `checkpoint.save` three times
  (`checkpoint_keep=2`: the third prunes the first); the walk is the driver's handling of
  the third save's message, from the first call that receives it.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import bench_table  # a sibling script, not a package

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
importers = {m: set() for m in modules}
for a in modules:
    for b in edges[a]:
        if b in importers and b != a:
            importers[b].add(a)
once = sorted((m, min(importers[m])) for m in modules if len(importers[m]) == 1)
print(json.dumps({"components": components, "pairs": pairs, "once": once}))
"""


# --- the walks: run in a child process per checkout (`--walk-child`) ---------------------


def _left_out(code: Any) -> bool:
    """Whether a walk leaves out what this code runs: a module body (an import) or a log
    record's handlers (sparkdist's console handler prints; its stops count log lines)."""
    return code.co_name == "<module>" or code is logging.Logger.callHandlers.__code__


class Tracer:
    """The stops of one walk: calls into a sparkdist module from another module, as a
    `sys.setprofile` function (installed in this thread and, with `threading.setprofile`,
    in the threads the walk starts).

    `until`: stop recording at the first call of a sparkdist function of that name (or the
    first thread started). `window`: record only inside the calls for which it gives a
    key (the outermost such call in a thread, until it returns), grouped by key."""

    def __init__(self, until: str | None = None, window: Callable[[Any], Any] = None):
        self.until, self.window = until, window
        self.active = True
        self.ended_at = ""  # what ended an `until` walk
        self.walks: dict[Any, tuple[list[str], list[str]]] = {}  # key -> (entries, stops)
        self._aside: dict[int, int] = {}  # thread -> module bodies, log handlers running
        self._open: dict[int, tuple[Any, Any]] = {}  # thread -> (window frame, key)
        self._skip: dict[int, bool] = {}  # thread -> a time-driven watcher?

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event not in ("call", "return") or not self.active:
            return
        thread = threading.get_ident()
        if _left_out(frame.f_code):
            self._aside[thread] = self._aside.get(thread, 0) + (1 if event == "call" else -1)
            return
        if event == "return":
            if self._open.get(thread, (None,))[0] is frame:
                del self._open[thread]
            return
        if self._aside.get(thread, 0) > 0 or self._watcher(thread):
            return
        if self.until and frame.f_code is threading.Thread.start.__code__:
            self.active, self.ended_at = False, "the first thread started"
            return
        module = frame.f_globals.get("__name__") or ""
        if not module.startswith("sparkdist"):
            return
        if self.until and frame.f_code.co_name == self.until:
            self.active, self.ended_at = False, f"the call of {module}.{self.until}"
            return
        key = None
        if self.window:
            if thread not in self._open:
                key = self.window(frame)
                if key is None:
                    return
                self._open[thread] = (frame, key)
                self.walks.setdefault(key, ([], []))[0].append(module)  # where it starts
                return
            key = self._open[thread][1]
        caller = frame.f_back.f_globals.get("__name__") if frame.f_back else None
        if caller != module:
            self.walks.setdefault(key, ([], []))[1].append(module)

    def _watcher(self, thread: int) -> bool:
        if thread not in self._skip:
            name = threading.current_thread().name
            self._skip[thread] = bool(re.search(r"progress", name))
        return self._skip[thread]

    @contextlib.contextmanager
    def tracing(self) -> Iterator[None]:
        threading.setprofile(self)
        sys.setprofile(self)
        try:
            yield
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
            self.active = False


def _checkpoint_message(frame: Any) -> Any:
    """The checkpoint message a call receives as an argument, if any (the key of its walk)."""
    for value in frame.f_locals.values():
        kind = type(value)
        if kind.__name__.startswith("Checkpoint") and kind.__module__.startswith("sparkdist"):
            return value
    return None


def _walk_options() -> Tracer:
    from sparkdist import HorovodRunner

    def main() -> int:
        return 1

    tracer = Tracer(until="form")
    with tracer.tracing():
        runner = HorovodRunner(
            np=2, launcher="direct", start_timeout=120, timeout=120, max_failures=1, env={}
        )
        runner.run(main)
    return tracer


def _walk_conversion(df: Any) -> tuple[Tracer, Any]:
    from sparkdist.data import make_spark_converter

    tracer = Tracer()
    with tracer.tracing():
        converter = make_spark_converter(df)
    return tracer, converter


def _walk_rank_read(converter: Any) -> Tracer:
    tracer = Tracer()
    with tracer.tracing():
        with converter.make_torch_dataloader(
            batch_size=32, num_epochs=1, cur_shard=0, shard_count=2
        ) as loader:
            rows = sum(len(batch["label"]) for batch in loader)
    assert rows == 200, rows
    return tracer


def _walk_fit(spark: Any) -> Tracer:
    from sklearn.linear_model import LogisticRegression

    from sparkdist.ensemble import PartitionEnsemble

    df = spark.range(400).selectExpr(
        "cast(id % 7 as double) as x", "cast(id % 5 as double) as y", "cast(id % 2 as int) as label"
    )
    tracer = Tracer()
    with tracer.tracing():
        PartitionEnsemble(LogisticRegression(), n_estimators=2, random_state=0).fit(
            df, ["x", "y"], "label"
        )
    return tracer


def _saves() -> int:
    from sparkdist import checkpoint

    for step in (1, 2, 3):
        checkpoint.save({"weights": [0.5] * 8, "step": step}, step=step)
    return step


def _walk_checkpoint() -> tuple[Tracer, Any]:
    from sparkdist import HorovodRunner

    tracer = Tracer(window=_checkpoint_message)
    with tracer.tracing():
        assert HorovodRunner(np=-1, checkpoint_keep=2).run(_saves) == 3
    saves = [key for key in tracer.walks if key is not None]
    return tracer, saves[-1]


def _walk_child() -> None:
    """Run every walk against the sparkdist first on sys.path; print them as JSON."""
    from pyspark.sql import SparkSession

    import sparkdist

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    walks: dict[str, Any] = {"sparkdist": sparkdist.__file__}

    def record(name: str, tracer: Tracer, key: Any = None, note: str = "") -> None:
        entries, stops = tracer.walks.get(key, ([], []))
        walks[name] = {"entries": entries, "stops": stops, "note": note}

    with tempfile.TemporaryDirectory() as work:
        source = f"{work}/source"
        spark.range(400).selectExpr(
            "cast(id as double) as features", "id % 2 as label"
        ).repartition(2).write.parquet(source)
        tracer = _walk_options()
        record("a job's options", tracer, note=f"up to {tracer.ended_at or 'its end'}")
        parquet = spark.read.parquet(source)
        tracer, in_place = _walk_conversion(parquet)
        record("make_spark_converter: Parquet", tracer, note="read in place")
        tracer, _ = _walk_conversion(parquet.selectExpr("features * 2 as features", "label"))
        record("make_spark_converter: computed", tracer, note="copied once")
        record("a rank's read", _walk_rank_read(in_place), note="the Parquet scan, rank 0 of 2")
        record("the ensemble's fit", _walk_fit(spark))
        tracer, last = _walk_checkpoint()
        record("a checkpoint commit", tracer, last, f"{type(last).__name__}, the third")
    spark.stop()
    print("WALKS " + json.dumps(walks))


def walks_of(checkout: Path) -> dict[str, Any]:
    """The walks of one checkout, from a child process with that checkout first on sys.path."""
    env = dict(os.environ, PYTHONPATH=str(checkout), PYSPARK_PYTHON=sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with tempfile.TemporaryDirectory() as work:
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--walk-child"],
            capture_output=True,
            text=True,
            env=env,
            cwd=work,
            timeout=900,
        )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("WALKS ")]
    if proc.returncode or not lines:
        raise SystemExit(f"the walks of {checkout} failed:\n{proc.stderr[-4000:]}")
    walks = json.loads(lines[-1].removeprefix("WALKS "))
    ran = Path(walks.pop("sparkdist")).resolve()
    if not ran.is_relative_to(checkout):
        raise SystemExit(f"the walks of {checkout} imported {ran}: another checkout's sparkdist")
    return walks


def _walk_summary(entries: list[str], stops: list[str]) -> dict[str, Any]:
    """Modules visited (with their stops), stops, and returns: a stop into a module the walk
    had visited and then left for another (two calls in a row into one module, e.g. a
    helper module's two functions, leave nothing)."""
    visited, returns, visits = set(entries), 0, {}
    last = entries[-1] if entries else None
    for module in stops:
        returns += module in visited and module != last
        visited.add(module)
        visits[module] = visits.get(module, 0) + 1
        last = module
    return {"modules": len(visited), "stops": len(stops), "returns": returns, "visits": visits}


def _package_of(relative: Path) -> str:
    """`sparkdist/runner/driver/job.py` -> `runner/driver`; top-level modules -> `(top)`."""
    parent = relative.parent.relative_to(PACKAGE).as_posix()
    return parent if parent != "." else "(top)"


def measure(checkout: Path, walks: bool) -> dict:
    root = checkout / PACKAGE
    if not root.is_dir():
        raise SystemExit(f"{checkout} has no {PACKAGE}/ directory: give a sparkdist checkout")
    packages: dict[str, list[int]] = {}
    longest: list[tuple[int, str, str]] = []
    lines_of: dict[str, int] = {}  # dotted module name -> lines
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(checkout)
        text = path.read_text()
        modules_lines = packages.setdefault(_package_of(relative), [0, 0])
        modules_lines[0] += 1
        modules_lines[1] += len(text.splitlines())
        dotted = ".".join(relative.with_suffix("").parts).removesuffix(".__init__")
        lines_of[dotted] = len(text.splitlines())
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
        "once": [(module, by, lines_of.get(module, 0)) for module, by in found["once"]],
        "walks": {
            name: {**_walk_summary(walk["entries"], walk["stops"]), "note": walk["note"]}
            for name, walk in (walks_of(checkout) if walks else {}).items()
        },
    }


def _table(title: str, headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = [f"\n{title}"]
    for row in [headers, ["-" * w for w in widths], *rows]:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    bench_table.print_table(title, title, headers, rows, text="\n".join(lines))


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
    _report_once(names, results)
    if any(r["walks"] for r in results):
        _report_walks(names, results)


def _short(module: str) -> str:
    return module.removeprefix(PACKAGE + ".")


def _report_once(names: list[str], results: list[dict]) -> None:
    rows = [["modules", *[str(len(r["once"])) for r in results]]]
    rows.append(["their lines", *[str(sum(n for *_, n in r["once"])) for r in results]])
    rows.append(
        ["of them under 60 lines", *[str(sum(n < 60 for *_, n in r["once"])) for r in results]]
    )
    _table("Modules imported by exactly one other module (grimp)", ["", *names], rows)
    for name, r in zip(names, results, strict=True):
        print(f"  {name}:")
        for module, by, lines in sorted(r["once"], key=lambda x: (x[2], x[0])):
            print(f"    {_short(module)} ({lines} lines) <- {_short(by)}")


def _report_walks(names: list[str], results: list[dict]) -> None:
    walk_names = list(dict.fromkeys(w for r in results for w in r["walks"]))
    rows = []
    for walk in walk_names:
        row = [walk]
        for r in results:
            found = r["walks"].get(walk)
            row += [str(found[k]) for k in ("modules", "stops", "returns")] if found else ["-"] * 3
        rows.append(row)
    headers = ["walk"] + [f"{h} {n}" for n in names for h in ("modules", "stops", "returns")]
    _table(
        "Walks, traced in the driver's process (stops into a module; returns to one left)",
        headers,
        rows,
    )
    for walk in walk_names:
        print(f"\n  {walk}: stops per module, in the order first visited")
        for name, r in zip(names, results, strict=True):
            found = r["walks"].get(walk)
            if found:
                visits = ", ".join(f"{_short(m)} {n}" for m, n in found["visits"].items())
                note = f" ({found['note']})" if found["note"] else ""
                print(f"    {name}{note}: {visits}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "checkouts",
        nargs="*",
        type=Path,
        help="directories holding sparkdist/ (default: this checkout); two or more print "
        "side by side",
    )
    parser.add_argument(
        "--no-walks", action="store_true", help="skip the walks (which start local Spark)"
    )
    parser.add_argument("--walk-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.walk_child:
        _walk_child()
        return
    checkouts = args.checkouts or [Path(__file__).resolve().parent.parent]
    names = [c.resolve().name for c in checkouts]
    if len(set(names)) < len(names):
        names = [str(c) for c in checkouts]
    report(names, [measure(c.resolve(), walks=not args.no_walks) for c in checkouts])


if __name__ == "__main__":
    main()
