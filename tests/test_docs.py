"""The documentation stays true: every code block in README.md and docs/ runs.

* python blocks of one page run in order as one script (so a block can use what an earlier
  one defined), in a fresh directory, against the test session's Spark (a page's
  `SparkSession.builder.getOrCreate()` gets it). The Spark Connect page runs in its own
  client process, as Connect users do (a client has no JVM), started with the first page
  so that it runs beside the others (it waits mostly on its own Connect server).
* bash blocks hold commands of known kinds, each checked: `make T` (T is a Makefile target),
  `pip install '.[extras]'` (the extras exist), `sparkdist ...` (parsed by the real CLI
  parser, so every flag and value is one it takes; `entrypoint`, `--version` and `--help`
  forms run for real, `doctor` as `doctor --help`: its checks start Spark, and
  tests/cli/test_doctor.py runs them), `spark-submit ... "$(sparkdist entrypoint)" ...` (the
  sparkdist part parsed), `python PATH --help` (runs). Any other command fails the test.
* yaml, json and ini blocks parse.
* text blocks are program output and diagrams, not code: they are the only blocks not run.
  A block without a language fails the test, so nothing escapes by omission.

`mkdocs build --strict` (the site, its links, the API reference) runs in `make test` and in
test_site_builds below.
"""

from __future__ import annotations

import configparser
import contextlib
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Pages whose python runs in a client process of its own (no JVM in it), not in this one.
OWN_PROCESS = {"docs/connect.md"}
LANGUAGES = {"python", "bash", "yaml", "json", "ini", "text"}


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def blocks(page: Path) -> list[tuple[str, str, int]]:
    """(language, code, first line) of every fenced block of a page, nested ones included."""
    found = []
    for token in MarkdownIt("commonmark").parse(page.read_text()):
        if token.type == "fence":
            found.append((token.info.strip().split(" ")[0], token.content, token.map[0] + 1))
        elif token.type == "code_block":
            found.append(("", token.content, token.map[0] + 1))
    return found


def test_every_block_has_a_known_language():
    bad = [
        f"{_name(page)}:{line} ({lang or 'no language'})"
        for page in PAGES
        for lang, _, line in blocks(page)
        if lang not in LANGUAGES
    ]
    assert not bad, f"blocks the docs test cannot check (use one of {sorted(LANGUAGES)}): {bad}"


def _script(page: Path) -> str:
    parts = []
    for lang, code, line in blocks(page):
        if lang == "python":
            parts.append(f"# --- {_name(page)}:{line}\n{code}")
    return "\n".join(parts)


PYTHON_PAGES = [page for page in PAGES if _script(page)]


class _OwnProcessPages:
    """The pages whose python runs in a client process of its own, started together at
    the first page test and running beside the in-process pages (they wait mostly on a
    JVM of their own: a Spark Connect server), then awaited each by its own test."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        for page in PYTHON_PAGES:
            name = _name(page)
            if name not in OWN_PROCESS or name in self.procs:
                continue
            workdir = self.directory / name.replace("/", "_")
            workdir.mkdir()
            (workdir / "page.py").write_text(_script(page))
            with open(workdir / "output.txt", "wb") as output:
                self.procs[name] = subprocess.Popen(
                    [sys.executable, "page.py"],
                    cwd=workdir,
                    env=env,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )

    def result(self, name: str) -> tuple[int, str]:
        proc = self.procs[name]
        try:
            code = proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
        output = (self.directory / name.replace("/", "_") / "output.txt").read_text()
        return code, output

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture(scope="module")
def own_process_pages(tmp_path_factory):
    pages = _OwnProcessPages(tmp_path_factory.mktemp("own-process-pages"))
    pages.start()
    yield pages
    pages.stop()


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=_name)
def test_python_blocks_run(page, own_process_pages, spark, tmp_path, monkeypatch):
    if _name(page) in OWN_PROCESS:
        code, output = own_process_pages.result(_name(page))
        assert code == 0, output[-6000:]
        return
    script = _script(page)
    monkeypatch.chdir(tmp_path)
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracking = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None
    try:
        exec(compile(script, _name(page), "exec"), {"__name__": "__docs__"})
    finally:
        mlflow.set_tracking_uri(tracking)


def _makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([\w-]+):", text, re.M))


def _extras() -> set[str]:
    text = (ROOT / "setup.py").read_text()
    return set(re.findall(r'^\s+"([\w-]+)": \[', text, re.M)) | {"all"}


def _commands(code: str) -> list[list[str]]:
    """The commands of a bash block: continuation lines joined, comments dropped,
    leading VAR=value assignments dropped."""
    joined = code.replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            words = words[1:]
        if words:
            commands.append(words)
    return commands


def _check_sparkdist(args: list[str], where: str) -> None:
    from sparkdist.cli import build_parser, main

    if args[-1:] == ["doctor"]:  # a check of the whole machine (starts Spark): its help here
        args = [*args, "--help"]  # cli/test_doctor.py runs the checks themselves
    if not args or set(args) & {"--version", "--help", "-h"} or args[0] == "entrypoint":
        # Run for real, in this process: the CLI's own `main` (what `sparkdist` and
        # `python -m sparkdist` call), without a new interpreter importing sparkdist again.
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(args)
            except SystemExit as stop:  # --help and --version end the parser this way
                code = stop.code
        assert not code, (where, err.getvalue()[-2000:])
        assert out.getvalue().strip(), (where, "printed nothing")
        return
    try:
        build_parser().parse_args(args)
    except SystemExit as stop:
        raise AssertionError(f"{where}: `sparkdist {shlex.join(args)}` does not parse") from stop


def check_command(words: list[str], where: str) -> None:
    head = words[0]
    if head == "make":
        missing = set(words[1:]) - _makefile_targets()
        assert not missing, f"{where}: no Makefile target {missing}"
    elif head == "pip" and words[1:2] == ["install"]:
        for spec in words[2:]:
            extras = re.findall(r"\[([\w,-]+)\]", spec)
            for name in ",".join(extras).split(",") if extras else []:
                assert name in _extras(), f"{where}: setup.py has no extra {name!r}"
    elif head == "sparkdist":
        _check_sparkdist(words[1:], where)
    elif head == "spark-submit":
        assert "$(sparkdist entrypoint)" in words, f"{where}: spark-submit of something else"
        _check_sparkdist(words[words.index("$(sparkdist entrypoint)") + 1 :], where)
    elif head == "python" and len(words) >= 3 and words[2] == "--help":
        assert (ROOT / words[1]).is_file(), f"{where}: no file {words[1]}"
        proc = subprocess.run(
            [sys.executable, str(ROOT / words[1]), "--help"], capture_output=True, timeout=60
        )
        assert proc.returncode == 0, (where, proc.stderr[-2000:])
    else:
        raise AssertionError(f"{where}: the docs test does not know how to check {words}")


BASH_BLOCKS = [
    (page, code, line) for page in PAGES for lang, code, line in blocks(page) if lang == "bash"
]


@pytest.mark.parametrize(
    "page, code, line", BASH_BLOCKS, ids=[f"{_name(p)}:{n}" for p, _, n in BASH_BLOCKS]
)
def test_bash_blocks(page, code, line):
    for words in _commands(code):
        check_command(words, f"{_name(page)}:{line}")


def test_config_blocks_parse():
    checked = 0
    for page in PAGES:
        for lang, code, line in blocks(page):
            where = f"{_name(page)}:{line}"
            if lang == "yaml":
                assert yaml.safe_load(code) is not None, where
            elif lang == "json":
                json.loads(code)
            elif lang == "ini":
                configparser.ConfigParser().read_string(code)
            else:
                continue
            checked += 1
    assert checked >= 1


def test_site_builds(tmp_path):
    """`mkdocs build --strict`: every page in the nav, every link and anchor resolves, and
    the API reference finds every name it documents."""
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert (tmp_path / "reference" / "api" / "index.html").is_file()


def test_readme_links_resolve():
    """README.md is not part of the site, so mkdocs does not check its links: this does."""
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    missing = [link for link in local if not (ROOT / link).exists()]
    assert local and not missing, f"README.md links to missing files: {missing}"
