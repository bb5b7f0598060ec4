"""docs/architecture.md stays true: its module table names every module, and only modules
that exist."""

import ast
import importlib.util
import io
import re
import tokenize
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
    (prose in docstrings and messages may name them). The one exception is mpirun's rsh
    agent, which imports nothing of sparkdist to start fast; tests/runner/test_rsh_relay.py
    checks that its two names are job_environment's."""
    exempt = {"sparkdist/job_environment.py", "sparkdist/runner/task/rsh.py"}
    spelled = set()
    for path in (ROOT / "sparkdist").rglob("*.py"):
        relative = path.relative_to(ROOT).as_posix()
        if relative in exempt:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if re.fullmatch(r"SPARKDIST_[A-Z0-9_]+", node.value):
                    spelled.add((relative, node.value))
    assert spelled == set(), "name these in sparkdist/job_environment.py"


def _too_long(root: Path, class_limit: int, function_limit: int) -> list[str]:
    limits = {ast.ClassDef: class_limit, ast.FunctionDef: function_limit}
    limits[ast.AsyncFunctionDef] = function_limit
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            limit = limits.get(type(node))
            length = node.end_lineno - node.lineno + 1 if limit else 0
            if limit and length > limit:
                where = path.relative_to(ROOT).as_posix()
                found.append(f"{where}:{node.lineno} {node.name}: {length} lines > {limit}")
    return found


def test_no_long_class_or_function_anywhere():
    """Issue 38's limits, for the whole package: a class over 250 lines or a function over
    60 is split (a newcomer reads one on a screen or two)."""
    too_long = _too_long(ROOT / "sparkdist", class_limit=250, function_limit=60)
    assert not too_long, "\n".join(too_long)


def test_no_long_class_in_the_runner():
    """Issue 30's stricter limit for the runner: a class over 200 lines is split."""
    too_long = _too_long(ROOT / "sparkdist" / "runner", class_limit=200, function_limit=60)
    assert not too_long, "\n".join(too_long)


def test_ruff_format_governs_every_line():
    """Issue 49: no `# fmt: skip` or `# fmt: off` anywhere (package, tests, benchmarks):
    the size limits hold because concepts are split, not because lines are packed."""
    packed = [
        where
        for folder in ("sparkdist", "tests", "benchmarks")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for where in _formatter_escapes(path)
    ]
    assert not packed, "lines kept from the formatter: " + ", ".join(packed)


def _formatter_escapes(path: Path) -> list[str]:
    """`path:line` of each comment that keeps ruff format off some lines."""
    pattern = re.compile(r"#\s*fmt:\s*(skip|off)\b")
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    where = path.relative_to(ROOT).as_posix()
    return [
        f"{where}:{token.start[0]}"
        for token in tokens
        if token.type == tokenize.COMMENT and pattern.search(token.string)
    ]


def test_the_driver_has_at_most_22_modules():
    """Issue 38: the driver's rooms are few and full (job state in three modules, the
    checkpoint's driver half in `checkpoint/`, single-use small modules merged)."""
    driver = ROOT / "sparkdist" / "runner" / "driver"
    modules = sorted(
        p.relative_to(driver).as_posix() for p in driver.rglob("*.py") if p.name != "__init__.py"
    )
    assert len(modules) <= 22, f"{len(modules)} modules under runner/driver/: {modules}"


# --- every code name the doc's prose and diagrams give exists --------------------------
#
# What counts as a code name in docs/architecture.md, outside its python/bash blocks:
# * in backticks: a path (`runner/driver/job.py`, `spark/`, `task/spark_task.py:run_gang_task`,
#   `tests/import_contracts.py`), a dotted name (`spark.file_scan`, `failures.FailureTracker.wait`,
#   `protocol/launch.LaunchSpec`, `Cluster.run_tasks`), a CapWords name (`JobState`,
#   `TaskHello(index, host, pid)`), a private name (`_Shuffled`), or a call (`form(plan, why)`);
#   not: ALL_CAPS names (environment variables: test_environment_names_... above and the
#   doc's own table), commands and flags (`make test`, `lint-imports`, `roles=`),
#   expressions (`np < 0`), plain lowercase words (`mpi`, `max_np`: values and options);
# * in the text diagrams: paths, private names, CapWords of two or more humps
#   (`DriverService`), and dotted names whose head is a sparkdist module or class
#   (`job.run_job`; `world.launch.start` names a variable, not code).
# A name resolves to a module file or package of sparkdist (a path may be given from any
# folder down: `cache.py`, `launch/barrier.py`), then to what that module defines
# (classes, functions, assignments, imports, `__all__`), then to a class's members
# (methods, class attributes, `self.x` set in a method, inherited from a sparkdist base).

EXTERNAL_NAMES = {"BarrierTaskContext", "TaskContext", "RendezvousHandler", "DataFrame"}
"""Names of other projects the doc names: pyspark's task contexts, torch.distributed.elastic's
rendezvous interface, Spark's DataFrame."""
EXTERNAL_PACKAGES = {"pyspark", "tf", "torch", "horovod", "mlflow", "optuna", "sklearn"}
"""Heads of dotted names that belong to other projects (`pyspark.sql.connect.plan`)."""


class _Package:
    """What sparkdist defines, by ast: its modules and, per module and per class, the names."""

    def __init__(self, root: Path):
        self.modules: dict[str, set[str]] = {}  # "runner/driver/job" -> its top-level names
        self.members: dict[str, set[str]] = {}  # class name -> members (all such classes)
        self.bases: dict[str, set[str]] = {}
        self.defined: set[str] = set()  # every class and function, at any depth
        self.packages: set[str] = set()
        for path in root.rglob("*.py"):
            key = path.relative_to(root).with_suffix("").as_posix()
            if path.name == "__init__.py":
                key = key.removesuffix("__init__").rstrip("/")
                self.packages.add(key)
            tree = ast.parse(path.read_text())
            self.modules[key] = self._top_names(tree)
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    self.defined.add(node.name)
                if isinstance(node, ast.ClassDef):
                    self.members.setdefault(node.name, set()).update(self._members(node))
                    self.bases.setdefault(node.name, set()).update(
                        b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")
                        for b in node.bases
                    )

    @staticmethod
    def _top_names(tree: ast.Module) -> set[str]:
        names = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        names.add(target.id)
                        if target.id == "__all__" and isinstance(node.value, ast.List):
                            names.update(e.value for e in node.value.elts)
        return names

    @staticmethod
    def _members(cls: ast.ClassDef) -> set[str]:
        names = _Package._top_names(ast.Module(body=cls.body, type_ignores=[]))
        for node in ast.walk(cls):
            targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                ):
                    names.add(target.attr)
        return names

    def named(self, name: str, files_only: bool = False) -> list[str]:
        """The modules `name` (`job`, `launch/barrier`, `sparkdist.spark`) may mean; with
        `files_only`, not packages (the package `model/` has no `.py` name)."""
        name = re.sub(r"^sparkdist(?:[./]|$)", "", name.replace(".", "/"))
        return [
            m
            for m in self.modules
            if (m == name or m.endswith("/" + name)) and not (files_only and m in self.packages)
        ]

    def has_member(self, cls: str, name: str, seen: frozenset = frozenset()) -> bool:
        if name in self.members.get(cls, ()):
            return True
        return any(
            self.has_member(b, name, seen | {cls}) for b in self.bases.get(cls, set()) - seen
        )

    def resolves(self, name: str) -> bool:
        name = re.sub(r"\(.*\)$", "", name)  # a call: `form(plan, why)`
        if name.split(".")[0] in EXTERNAL_PACKAGES or name in EXTERNAL_NAMES:
            return True
        file, _, inner = name.partition(":")  # `task/spark_task.py:run_gang_task`
        if file.endswith("/"):  # a folder: `runner/driver/launch/`, `sparkdist/`
            return (ROOT / file).is_dir() or bool(self.named(file.rstrip("/")))
        top = file.split("/")[0]
        if re.search(r"\.(toml|md|ya?ml|cfg|txt)$", file) or (
            (ROOT / top).is_dir() and top != file
        ):
            path = ROOT / file  # from the repository's root: `tests/...`, `sparkdist/...`
            return path.is_file() and (
                not inner or inner in self._top_names(ast.parse(path.read_text()))
            )
        if file.endswith(".py"):
            modules = self.named(file.removesuffix(".py"), files_only=True)
            return any(not inner or inner in self.modules[m] for m in modules)
        parts = name.split(".")  # a module, then what it defines: the longest that resolves
        for i in range(len(parts), 0, -1):
            for module in self.named("/".join(parts[:i])):
                if self._in_module(module, parts[i:]):
                    return True
        return parts[0] in self.defined and self._in_class(parts[0], parts[1:])

    def _in_module(self, module: str, attributes: list[str]) -> bool:
        if not attributes:
            return True
        first, *rest = attributes
        return first in self.modules[module] and self._in_class(first, rest)

    def _in_class(self, cls: str, attributes: list[str]) -> bool:
        if not attributes:
            return True
        return len(attributes) == 1 and self.has_member(cls, attributes[0])

    def is_code(self, name: str) -> bool:
        """Whether a dotted name in a diagram starts with sparkdist's code (not a variable)."""
        head = name.split(".")[0]
        return bool(self.named(head)) or head in self.members or head in EXTERNAL_PACKAGES


def _prose_and_diagrams() -> tuple[list[str], list[str]]:
    """docs/architecture.md's backticked spans outside code blocks, and its text diagrams."""
    text = DOC.read_text()
    diagrams = re.findall(r"^```text\n(.*?)^```", text, flags=re.S | re.M)
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.findall(r"`([^`\n]+)`", prose), diagrams


def _is_code_span(span: str) -> bool:
    bare = re.sub(r"\(.*\)$", "", span) if re.fullmatch(r"[\w./:]+\(.*\)", span) else span
    if not re.fullmatch(r"[\w./:]+", bare) or re.fullmatch(r"[A-Z0-9_]+", bare):
        return False  # commands, flags, expressions; environment variables and constants
    if bare.startswith(".") or re.fullmatch(r"\w+:\w+", bare):  # `.proto`, `host:port`
        return False
    return (
        "/" in bare
        or "." in bare
        or bare.startswith("_")
        or bool(re.fullmatch(r"[A-Z]\w*", bare))
        or bare != span  # a call, `form(plan, why)`
    )


def _diagram_names(diagram: str, package: _Package) -> set[str]:
    names = set()
    pattern = r"(?<![\w/.])[A-Za-z_][\w/]*(?:\.[A-Za-z_][\w/]*)*(?::\w+)?"
    for word in re.findall(pattern, diagram):
        if (
            re.search(r"\.py(:\w+)?$", word)
            or word.startswith("_")
            or word.endswith("/")
            or ("." in word and package.is_code(word))
            or re.fullmatch(r"[A-Z][a-z0-9]+[A-Z]\w*", word)
        ):
            names.add(word)
    return names


def test_every_code_name_in_the_doc_exists():
    """The doc's prose and diagrams name only modules, classes and functions that exist:
    a move or a rename updates the doc in the same change."""
    package = _Package(ROOT / "sparkdist")
    spans, diagrams = _prose_and_diagrams()
    named = {s for s in spans if _is_code_span(s)}
    named |= {n for d in diagrams for n in _diagram_names(d, package)}
    assert len(named) > 100, "the doc's names were not found: is the test still reading it?"
    missing = sorted(n for n in named if not package.resolves(n))
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"


def test_the_doc_name_check_catches_stale_names():
    """The check above is not vacuous: names that do not exist fail it, names that do pass."""
    package = _Package(ROOT / "sparkdist")
    for stale in ["scan.py", "model.py", "_Shuffled", "spark.nothing_here", "JobState.no_method"]:
        assert not package.resolves(stale), stale
    for real in ["runner/driver/job.py", "spark.file_scan", "HorovodRunner.run", "Cluster"]:
        assert package.resolves(real), real
    assert _is_code_span("TaskHello(index, host, pid)") and _is_code_span("_OwnRows")
    assert not any(map(_is_code_span, ["SPARKDIST_RANK", "make test", "np < 0", "mpi"]))


# --- the names sparkdist's own docstrings and comments give --------------------------------
# A docstring or comment names code in three forms, each checked by `_Package.resolves`:
# a dotted name from the top (`sparkdist.spark.file_scan`), a path (`launch/barrier.py`,
# `runner/driver/launch/`), or a backticked module and class (`relayed.RelayPlan`, whose
# head is no other project's module and no name sparkdist imports `as`). Package
# docstrings that list more than half of their package's modules list all of them, and
# name no module that is gone. "Section" in the README or a docs page names a heading of
# that page.

SCANNED = [ROOT / "tests" / "test_architecture.py"]
"""Files outside sparkdist/ whose comments give examples of names (this one)."""


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring (any string statement) of a module."""
    source = path.read_text()
    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            if isinstance(node.value.value, str):
                found.append((node.lineno, node.value.value))
    return found


def _import_aliases() -> set[str]:
    """The names sparkdist imports modules under (`np`, `dist`, `pq`): heads of others' names."""
    names = set()
    for path in (ROOT / "sparkdist").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _is_other_module(head: str, aliases: set[str]) -> bool:
    if head in aliases or head in ("self", "cls"):
        return True
    try:
        return importlib.util.find_spec(head) is not None
    except (ImportError, ValueError):
        return False


def _code_names(text: str, aliases: set[str]) -> set[str]:
    """The names of code in one comment or docstring, in the three forms above."""
    names = set(re.findall(r"(?<![\w.])sparkdist(?:\.[A-Za-z_]\w*)+", text))
    names |= set(re.findall(r"(?<![\w/.`-])(?:[\w-]+/)+[\w-]+\.py\b", text))
    for span in re.findall(r"`([^`\n]+)`", text):
        head = re.split(r"[./]", span)[0]
        if re.fullmatch(r"(?:\w+/)+", span) or re.fullmatch(r"[\w/]+\.py(?::\w+)?", span):
            if "/" in span or not _is_other_module(head, aliases):  # not `socket.py`
                if (
                    (ROOT / head).is_dir()
                    or (ROOT / "sparkdist" / head).exists()
                    or "/" not in span
                ):
                    names.add(span)
        elif re.fullmatch(r"[a-z_]\w*\.[A-Z]\w*(?:\.\w+)?", span):
            if not _is_other_module(head, aliases):
                names.add(span)
    return names


def _stale_code_names(files: list[Path], package: _Package) -> list[str]:
    aliases = _import_aliases()
    return [
        f"{path.relative_to(ROOT).as_posix()}:{line}: {name}"
        for path in files
        for line, text in _prose(path)
        for name in sorted(_code_names(text, aliases))
        if not package.resolves(name)
    ]


def test_every_code_name_in_a_docstring_or_comment_exists():
    """sparkdist's docstrings and comments name only modules, folders and classes that
    exist: a move or a rename updates the words that point at it."""
    package = _Package(ROOT / "sparkdist")
    files = sorted((ROOT / "sparkdist").rglob("*.py")) + SCANNED
    stale = _stale_code_names(files, package)
    assert not stale, "names of code that does not exist:\n" + "\n".join(stale)


def _listing_problems(init: Path, package: _Package, docstring: str | None = None) -> list[str]:
    """What a package docstring (``docstring``, else its own) that lists more than half of
    its modules leaves out or names wrongly."""
    folder = init.parent
    modules = {p.stem for p in folder.glob("*.py")} - {"__init__", "__main__"}
    modules |= {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
    if docstring is None:
        docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
    bare = set(re.findall(r"`([a-z_]\w*)(?:\.py)?`", docstring))
    listed = (
        bare | set(re.findall(r"`([a-z_]\w*)\.\w+`", docstring))
    ) & modules  # `api.LaunchKind`
    if len(listed) * 2 <= len(modules) or len(listed) < 2:
        return []  # not a list of the package's modules
    key = folder.relative_to(ROOT / "sparkdist").as_posix()
    defined = set(package.modules[key]).union(
        *(package.modules.get(f"{key}/{m}", set()) for m in modules)
    )
    where = init.relative_to(ROOT).as_posix()
    problems = [f"{where} leaves out the module `{m}`" for m in sorted(modules - listed)]
    unknown = sorted(bare - modules - defined)
    return problems + [f"{where} names `{name}`, no module of it" for name in unknown]


def test_a_package_docstring_that_lists_its_modules_lists_them_all():
    package = _Package(ROOT / "sparkdist")
    problems = [
        problem
        for init in sorted((ROOT / "sparkdist").rglob("__init__.py"))
        for problem in _listing_problems(init, package)
    ]
    assert not problems, "\n".join(problems)


def _headings(page: Path) -> list[str]:
    """A page's headings and the bold words that open its list items (`* **Codec.** ...`)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    found = re.findall(r"^#+ (.+)$", text, flags=re.M)
    found += re.findall(r"^\s*[*-] \*\*(.+?)\*\*", text, flags=re.M)
    return [h.replace("`", "").strip() for h in found]


def _is_section(section: str, page: Path) -> bool:
    """A heading is the section, or starts with it and then a space or a stop."""
    return any(
        h == section or (h.startswith(section) and h[len(section)] in " :.,")
        for h in _headings(page)
    )


def _section_references(text: str) -> list[tuple[str, str]]:
    """(page, section) of `"Section" in the README`, `(docs/x.md, "Section")` and
    `docs/x.md ("Section")`."""
    page = r"(README(?:\.md)?|docs/[\w/-]+\.md)"
    text = re.sub(r"\s+", " ", text)
    found = [(p, s) for s, p in re.findall(r'"([^"]+)" in (?:the )?' + page, text)]
    return found + re.findall(page + r',? \(?"([^"]+)"', text)


def _stale_sections(files: list[Path]) -> list[str]:
    stale = []
    for path in files:
        for line, text in _prose(path):
            for page, section in _section_references(text):
                file = ROOT / ("README.md" if page.startswith("README") else page)
                if not file.is_file() or not _is_section(section, file):
                    where = path.relative_to(ROOT).as_posix()
                    stale.append(f'{where}:{line}: "{section}" in {page}')
    return stale


def test_every_readme_or_docs_section_a_docstring_names_exists():
    """`See "Elastic training" in the README` points at a heading that is there."""
    stale = _stale_sections(sorted((ROOT / "sparkdist").rglob("*.py")))
    assert not stale, "sections that do not exist:\n" + "\n".join(stale)


def test_the_docstring_checks_catch_stale_words():
    """The three checks above are not vacuous: the stale words issue 49 found fail them,
    names that exist and other projects' names pass."""
    package, aliases = _Package(ROOT / "sparkdist"), _import_aliases()
    for stale in ["A `relay.RelayPlan` when", "a folder: `runner/driver/state/`", "sparkdist.nope"]:
        names = _code_names(stale, aliases)
        assert names and not all(map(package.resolves, names)), stale
    for real in ["`relayed.RelayPlan`", "`runner/driver/launch/`", "sparkdist.spark.file_scan."]:
        names = _code_names(real, aliases)
        assert names and all(map(package.resolves, names)), real
    for other in ["`np.ndarray`", "`socket.py`", "`pa.Table`", "`_delta_log/`", "`self.Plan`"]:
        assert not _code_names(other, aliases), other
    old = "`wire`, `messages`, `payload`, `script`, `launch`, `processes`, `stack_dumps`"
    protocol = ROOT / "sparkdist" / "protocol" / "__init__.py"
    assert len(_listing_problems(protocol, package, old)) == 5  # and left_stacks, owned_dirs
    rank = ROOT / "sparkdist" / "runner" / "rank" / "__init__.py"
    assert _listing_problems(
        rank, package, "`supervisor`, `main`, `warm`, `kept_group`, with `channel`"
    ) == ["sparkdist/runner/rank/__init__.py names `channel`, no module of it"]
    refs = _section_references('See "Elastic training"\n    in the README. (docs/data.md, "Codec")')
    assert refs == [("README", "Elastic training"), ("docs/data.md", "Codec")]
    assert not _is_section("Elastic training", ROOT / "README.md")
    assert not _is_section("Data", ROOT / "README.md")  # "DataFrames to ranks" is another
    assert _is_section("Elastic training", ROOT / "docs" / "elastic.md")
    assert _is_section("Codec", ROOT / "docs" / "data.md")  # a list item's bold opening
