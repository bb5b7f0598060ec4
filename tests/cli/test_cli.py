"""The `sparkdist` command's options and its errors: each usage error is one line and
exit code 2 before any Spark starts; a failed job is exit code 1, Ctrl-C 130; every
option has help; -v/-q work after the subcommand too. The command's runs on Spark are
in tests/cli/test_scripts_cli.py, tests/test_clean_output.py and tests/spark/test_connect.py."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import run_cli

import sparkdist
from sparkdist import HorovodRunner
from sparkdist.cli import _runner_options, build_parser
from sparkdist.runner.driver.job_spec import RunnerOptions


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def test_version(capsys):
    code, out, _ = run_cli(capsys, "--version")
    assert code == 0 and out.strip() == f"sparkdist {sparkdist.__version__}"


def test_every_option_has_help_and_exit_codes_are_documented():
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in [("sparkdist", parser), *commands.choices.items()]:
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help, f"{name}: {action.option_strings or action.dest} has no help"
        assert "exit codes:" in sub.format_help() and "130" in sub.format_help()


def test_global_options_before_and_after_the_command():
    parser = build_parser()
    assert parser.parse_args(["-v", "run", "--np", "2", "x.py"]).verbose
    assert parser.parse_args(["run", "--np", "2", "-v", "x.py"]).verbose
    assert parser.parse_args(["doctor", "-q"]).quiet
    plain = parser.parse_args(["run", "--np", "2", "x.py"])
    assert not plain.verbose and not plain.quiet


def test_runner_options_are_flags():
    args = build_parser().parse_args(
        [
            "run",
            "--np",
            "4",
            "--env",
            "A=1",
            "--env",
            "B=x=y",
            "--mpi-args",
            "--mca btl_tcp_links 2",
            "--network-interface",
            "lo",
            "--ranks-per-task",
            "2",
            "--retry-on-exception",
            "--driver-log-verbosity",
            "log_callback_only",
            "--timeline",
            "/tmp/t.json",
            "--report-ranks",
            "all",
            "train.py",
            "--",
            "--lr",
            "1",
        ]
    )
    assert args.env == [("A", "1"), ("B", "x=y")]
    assert args.mpi_args == ["--mca", "btl_tcp_links", "2"]
    assert (args.network_interface, args.ranks_per_task) == ("lo", 2)
    assert args.retry_on_exception and args.driver_log_verbosity == "log_callback_only"
    assert (args.timeline, args.report_ranks) == ("/tmp/t.json", "all")
    assert args.script_args[-2:] == ["--lr", "1"]


def _runner_flags() -> dict[str, argparse.Action]:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    run = commands.choices["run"]
    return {flag: action for action in run._actions for flag in action.option_strings}


def test_every_runner_option_is_a_documented_flag():
    """A flag per RunnerOptions field, generated from it (so adding an option adds its flag),
    each HorovodRunner's keyword of the same name and default, and named in docs/cli.md's
    table."""
    names = [option.name for option in dataclasses.fields(RunnerOptions)]
    keywords = inspect.signature(HorovodRunner).parameters
    assert names == list(keywords)
    # The same defaults: HorovodRunner's are RunnerOptions' (env's None stands for {}).
    for option in dataclasses.fields(RunnerOptions):
        default = keywords[option.name].default
        if option.default is not dataclasses.MISSING:
            assert default == option.default, option.name
        else:
            assert (default, option.name) in ((inspect.Parameter.empty, "np"), (None, "env"))
    # And the CLI's: each flag left out gives its option's default, named when it does not.
    given = _runner_options(build_parser().parse_args(["run", "--np", "2", "x.py"]))
    defaults = RunnerOptions(np=2)
    for name in set(names) - {"np"}:  # np is required
        from_flag = getattr(RunnerOptions(np=2, **{name: given[name]}), name)
        assert from_flag == getattr(defaults, name), f"--{name.replace('_', '-')}"
    flags = _runner_flags()
    table = (Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    table = table.split("| flag | option | meaning |", 1)[1].split("\n\n", 1)[0]
    for name in names:
        flag = "--" + name.replace("_", "-")
        assert flags[flag].dest == name and flags[flag].help, flag
        assert f"`{flag}" in table and f"`{name}`" in table, f"docs/cli.md lacks {flag}"
    documented = set(re.findall(r"`(--[a-z-]+)", table))
    assert documented <= set(flags), documented - set(flags)


def test_runner_flags_give_the_runners_options():
    parser = build_parser()
    plain = parser.parse_args(["run", "--np", "2", "x.py"])
    assert RunnerOptions(**_runner_options(plain)) == RunnerOptions(np=2)
    args = parser.parse_args(
        [
            "run",
            "--np",
            "4",
            "--driver-log-verbosity",
            "log_callback_only",
            "--launcher",
            "direct",
            "--start-timeout",
            "30",
            "--timeout",
            "90.5",
            "--env",
            "A=1",
            "--env",
            "B=x=y",
            "--mpi-args",
            "--mca btl_tcp_links 2",
            "--network-interface",
            "lo",
            "--timeline",
            "/tmp/t.json",
            "--max-failures",
            "3",
            "--retry-on-exception",
            "--checkpoint-dir",
            "/tmp/ck",
            "--checkpoint-keep",
            "5",
            "--ranks-per-task",
            "2",
            "--min-np",
            "2",
            "--max-np",
            "6",
            "--report-ranks",
            "all",
            "x.py",
        ]
    )
    assert RunnerOptions(**_runner_options(args)) == RunnerOptions(
        np=4,
        driver_log_verbosity="log_callback_only",
        launcher="direct",
        start_timeout=30.0,
        timeout=90.5,
        env={"A": "1", "B": "x=y"},
        mpi_args=("--mca", "btl_tcp_links", "2"),
        network_interface="lo",
        timeline="/tmp/t.json",
        max_failures=3,
        retry_on_exception=True,
        checkpoint_dir="/tmp/ck",
        checkpoint_keep=5,
        ranks_per_task=2,
        min_np=2,
        max_np=6,
        report_ranks="all",
    )
    roles = parser.parse_args(["run", "--np", "4", "--roles", "chief=1,worker=2,ps=1", "x.py"])
    assert (
        RunnerOptions(**_runner_options(roles)).roles
        == RunnerOptions(np=4, roles={"chief": 1, "worker": 2, "ps": 1}).roles
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--np", "2", "{tmp}/missing.py"], "no such script: {tmp}/missing.py"),
        (["run", "--np", "2", "{tmp}"], "{tmp} is a directory"),
        (
            ["run", "--np", "2", "--master", "local[2]", "--remote", "sc://h:1", "{script}"],
            "give --master or --remote, not both",
        ),
        (
            ["run", "--np", "3", "--ranks-per-task", "2", "{script}"],
            "np=3 must be a multiple of ranks_per_task=2",
        ),
        (["run", "--np", "2", "--roles", "chief=1,worker=5", "{script}"], "roles"),
        (["run", "--np", "2", "--env", "NOEQUALS", "{script}"], "expected NAME=VALUE"),
        (["run", "--np", "two", "{script}"], "invalid int value: 'two'"),
        (["run", "--np", "2", "--timeout", "-1", "{script}"], "positive number of seconds"),
        (["run", "--np", "2", "--launcher", "ssh", "{script}"], "invalid choice: 'ssh'"),
        (["run", "--np", "2", "--checkpoint-keep", "0", "{script}"], "checkpoint_keep must be"),
        (["run", "--np", "2", "--min-np", "3", "{script}"], "min_np=3 is more than max_np=2"),
        (["run", "{script}"], "the following arguments are required: --np"),
        (["run", "--np", "2", "--bogus", "{script}"], "unrecognized arguments: --bogus"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(capsys, tmp_path, argv, message):
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    fill = {"tmp": str(tmp_path), "script": str(script)}
    code, out, err = run_cli(capsys, *[a.format(**fill) for a in argv])
    assert code == 2 and not out
    line = one_line(err)
    assert line.startswith("sparkdist") and "error: " in line and message.format(**fill) in line


def test_a_mistyped_script_fails_before_spark_starts(tmp_path):
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "sparkdist", "run", "--np", "2", str(tmp_path / "tarin.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and not done.stdout
    assert one_line(done.stderr) == f"sparkdist run: error: no such script: {tmp_path}/tarin.py"
    assert time.monotonic() - started < 60  # no JVM was started (it would print and take long)


def test_a_failing_job_exits_1(capsys, tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("raise RuntimeError('bad data')\n")
    code, _, err = run_cli(capsys, "run", "--np", "-1", "--launcher", "direct", str(script))
    assert code == 1
    assert "sparkdist run: RankFailedError: rank 0" in err and "bad data" in err


def test_ctrl_c_stops_the_job_and_exits_130(tmp_path):
    script = tmp_path / "waits.py"
    script.write_text("import time\nprint('ready', flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sparkdist",
            "run",
            "--np",
            "-1",
            "--launcher",
            "direct",
            str(script),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in proc.stdout:
            if "[rank 0] ready" in line:
                break
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "sparkdist run: interrupted" in err
