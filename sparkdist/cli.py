"""The `sparkdist` command: demo, run (also under spark-submit), timeline, doctor."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import logging
import os
import shlex
import signal
import sys
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

# The module's docstring is the command's help. Each subcommand is a function that adds its
# parser (`_add_run`) beside the function that runs it (`_run`); `run`'s flags for the
# runner are made from `RunnerOptions`, so a new runner option needs no change here.

# --- The command, its exit codes and the options every subcommand takes -------------------

_Commands = argparse._SubParsersAction  # what each subcommand is added to

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_CODES = """exit codes:
  0    success (doctor: every required check passed)
  1    the job failed: a rank raised or exited non-zero, a rank or executor was lost,
       a time limit ran out, too few task slots (doctor: a required check failed)
  2    bad usage: an unknown or invalid option, a missing or unreadable script
       (timeline: no readable trace in JOB_DIR); reported in one line before Spark starts
  130  interrupted (Ctrl-C): the job's Spark stage was cancelled and its ranks stopped

environment:
  SPARKDIST_LOG_LEVEL  level of sparkdist's log lines in Python (default INFO; the
                       command shows WARNING and above unless -v)
  SPARKDIST_PROGRESS   0 hides progress displays
  SPARK_REMOTE         a Spark Connect URL (like --remote)
"""


class _Parser(argparse.ArgumentParser):
    """Reports a usage error in one line (with where to find help), exit code 2."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _global_options(defaults: bool) -> argparse.ArgumentParser:
    """-v/-q, accepted before and after the subcommand (a subcommand's copy has no
    defaults, so that it does not undo what was given before it)."""
    parent = _Parser(add_help=False)
    default = {} if defaults else {"default": argparse.SUPPRESS}
    group = parent.add_mutually_exclusive_group()
    group.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        **default,
        help="log at INFO level (sparkdist, Spark's Python side, MLflow)",
    )
    group.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        **default,
        help="only errors: no progress displays, no warnings",
    )
    return parent


def build_parser() -> argparse.ArgumentParser:
    from sparkdist import __version__

    parser = _Parser(
        prog="sparkdist",
        description=__doc__,
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[_global_options(defaults=True)],
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"sparkdist {__version__}",
        help="print the version and exit",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_command in (_add_demo, _add_run, _add_timeline, _add_doctor, _add_entrypoint):
        add_command(commands)
    return parser


def _command(
    commands: _Commands, name: str, help: str, func: Callable[[argparse.Namespace], int], **kwargs
) -> argparse.ArgumentParser:
    """A subcommand that runs `func(args)`, with -v/-q and the exit codes in its help."""
    parser = commands.add_parser(
        name,
        help=help,
        parents=[_global_options(defaults=False)],
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        **kwargs,
    )
    parser.set_defaults(func=func)
    return parser


def _configure_logging(args: argparse.Namespace) -> None:
    """-v: INFO lines of everything; default: sparkdist's warnings and its progress;
    -q: errors only."""
    level = logging.INFO if args.verbose else logging.ERROR if args.quiet else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("sparkdist").setLevel(level)
    if not args.quiet:
        logging.getLogger("sparkdist.progress").setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging(args)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"sparkdist {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


# --- demo ---------------------------------------------------------------------------------


def _add_demo(commands: _Commands) -> None:
    summary = "every path end to end on an embedded Spark: DDP, Horovod, TensorFlow, ensembles"
    demo = _command(commands, "demo", summary, _demo)
    demo.add_argument("--np", type=int, default=2, help="ranks of each runner job (default 2)")
    demo.add_argument("--executors", type=int, default=2, help="executors of the embedded Spark")
    demo.add_argument("--epochs", type=int, default=20, help="epochs of the DDP and Horovod jobs")
    demo.add_argument("--tf-epochs", type=int, default=8, help="epochs of the TensorFlow job")
    demo.add_argument("--models", type=int, default=4, help="models in the partition ensemble")
    demo.add_argument(
        "--output-dir",
        default="sparkdist-demo",
        help="where the timeline, checkpoints and the Keras model go (default ./sparkdist-demo)",
    )


def _demo(args: argparse.Namespace) -> int:
    from sparkdist.demos.full import DemoOptions, run_demo

    return run_demo(
        DemoOptions(
            np=args.np,
            executors=args.executors,
            epochs=args.epochs,
            tf_epochs=args.tf_epochs,
            models=args.models,
            output_dir=args.output_dir,
        )
    )


# --- run ----------------------------------------------------------------------------------


def _add_run(commands: _Commands) -> None:
    run = _command(
        commands,
        "run",
        "run a training script on N ranks",
        _run,
        description="Run SCRIPT on N ranks as __main__; arguments after -- go to the script. "
        "With --remote (or SPARK_REMOTE) it runs through that Spark Connect server; under "
        "spark-submit it uses that Spark; otherwise --master, else an embedded Spark. "
        "Every HorovodRunner option is a flag of the same name.",
    )
    run.add_argument("--master", help="Spark master URL (default: spark-submit's or embedded)")
    run.add_argument(
        "--remote", help="a Spark Connect URL, sc://host:port (default: env SPARK_REMOTE)"
    )
    run.add_argument(
        "--executors", type=int, default=2, help="executors of an embedded Spark (default 2)"
    )
    _add_runner_flags(run.add_argument_group("HorovodRunner's options"))
    run.add_argument("script", help="the Python training script")
    run.add_argument("script_args", nargs=argparse.REMAINDER, help="-- then the script's arguments")


def _run(args: argparse.Namespace) -> int:
    from sparkdist import HorovodRunner
    from sparkdist.errors import SparkdistError
    from sparkdist.spark.session import stop_session

    problem = _bad_run_arguments(args)
    if problem:
        return _usage_error(problem)
    try:
        runner = HorovodRunner(**_runner_options(args))
    except ValueError as exc:  # checked before any Spark starts
        return _usage_error(str(exc))
    # SIGTERM (a scheduler, `kill`) stops the job as Ctrl-C does: stacks shown first.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    script_args = list(args.script_args)
    if script_args[:1] == ["--"]:
        script_args = script_args[1:]
    spark = _session(args) if args.np > 0 else None
    try:
        runner.run(args.script, args=script_args)
    except SparkdistError as exc:
        print(f"sparkdist run: {type(exc).__name__}: {exc}", file=sys.stderr)
        _print_trace(runner)
        return EXIT_FAILED
    finally:
        if spark is not None:
            # Stop Spark here rather than in its shutdown hook, which under spark-submit
            # and local-cluster logs a "Failed to launch executor" error per executor.
            stop_session(spark)
    print(
        f"sparkdist run: {args.script} finished on {abs(args.np)} ranks in "
        f"{runner.last_job.wall_time_s:.1f}s",
        file=sys.stderr,
    )
    _print_trace(runner)
    return EXIT_OK


def _print_trace(runner: Any) -> None:
    """Where the job's trace is, and the command that draws it (if the job wrote one)."""
    trace = getattr(runner.last_job, "trace", None)
    if trace:
        where = shlex.quote(os.path.dirname(trace) or ".")
        print(
            f"sparkdist run: trace: {trace} (draw it: sparkdist timeline {where})", file=sys.stderr
        )


def _bad_run_arguments(args: argparse.Namespace) -> str | None:
    """What is wrong with `run`'s arguments beyond the runner's options, if anything."""
    if os.path.isdir(args.script):
        return f"{args.script} is a directory: give the training script's path"
    if not os.path.isfile(args.script):
        return f"no such script: {args.script}"
    if not os.access(args.script, os.R_OK):
        return f"cannot read the script {args.script} (permissions)"
    if args.remote and args.master:
        return "give --master or --remote, not both"
    return None


def _usage_error(message: str) -> int:
    print(f"sparkdist run: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _session(args: argparse.Namespace):
    """A Spark Connect server with --remote (or SPARK_REMOTE); under spark-submit (or with
    --master) that Spark; otherwise an embedded one."""
    from pyspark.sql import SparkSession

    from sparkdist.spark.session import embedded_spark

    remote = args.remote or (None if args.master else os.environ.get("SPARK_REMOTE"))
    if remote:
        return SparkSession.builder.remote(remote).getOrCreate()
    if args.master or "PYSPARK_GATEWAY_PORT" in os.environ:
        builder = SparkSession.builder.appName("sparkdist-run")
        if args.master:
            builder = builder.master(args.master)
        return builder.getOrCreate()
    return embedded_spark(executors=args.executors, app_name="sparkdist-run")


# --- run's runner flags: one per `RunnerOptions` field ------------------------------------


def _add_runner_flags(group: argparse._ArgumentGroup) -> None:
    """A flag per `RunnerOptions` field: `--ranks-per-task` for `ranks_per_task`, required
    when the field has no default. The field's metadata gives its help, choices or metavar;
    its type how the flag's text is parsed (`_parsing`)."""
    for option, hint in _runner_fields():
        missing = dataclasses.MISSING
        required = option.default is missing and option.default_factory is missing
        keywords = {"required": True} if required else {"default": option.default}
        keywords.update(copy.deepcopy(_parsing(hint)))  # its own default list
        keywords.update(option.metadata)
        group.add_argument("--" + option.name.replace("_", "-"), dest=option.name, **keywords)


def _runner_options(args: argparse.Namespace) -> dict[str, Any]:
    """`HorovodRunner`'s keyword arguments from the parsed runner flags."""
    options = {}
    for option, hint in _runner_fields():
        value = getattr(args, option.name)
        # --env's (NAME, VALUE) pairs become the mapping the field holds.
        options[option.name] = dict(value) if typing.get_origin(hint) is Mapping else value
    return options


def _runner_fields() -> list[tuple[dataclasses.Field, Any]]:
    """Each `RunnerOptions` field with its type."""
    from sparkdist.runner.driver.job_spec import RunnerOptions

    hints = typing.get_type_hints(RunnerOptions)
    return [(option, hints[option.name]) for option in dataclasses.fields(RunnerOptions)]


def _parsing(hint: Any) -> dict[str, Any]:
    """How a flag's text becomes a value of a field's type (argparse keywords). A field
    that may be None takes its other type; one that may be a string (`roles`) takes the
    text as it is, which `RunnerOptions` parses."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        kinds = [kind for kind in typing.get_args(hint) if kind is not type(None)]
        if str in kinds:
            return _PARSING[str]
        if len(kinds) == 1:
            hint = kinds[0]
    if hint not in _PARSING:
        raise TypeError(f"a RunnerOptions field of type {hint} has no flag: add it to _PARSING")
    return _PARSING[hint]


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return key, value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text}")
    return value


_PARSING: dict[Any, dict[str, Any]] = {
    str: {},
    int: {"type": int},
    float: {"type": _positive_seconds},  # the runner's float options are seconds
    bool: {"action": "store_true"},
    # --env A=1 --env B=2: repeated, each NAME=VALUE
    Mapping[str, str]: {"type": _key_value, "action": "append", "default": []},
    # --mpi-args "--mca btl_tcp_links 2": one string, split as a shell would
    tuple[str, ...]: {"type": shlex.split, "default": []},
}


# --- timeline -----------------------------------------------------------------------------

TIMELINE_FILES = ("timeline.html", "timeline.png")


def _add_timeline(commands: _Commands) -> None:
    timeline = _command(
        commands,
        "timeline",
        "draw a finished job's trace: timeline.html and timeline.png",
        _timeline,
        description="Draw the trace of a job (JOB_DIR/trace.json: the folder of "
        "runner.last_job.trace, beside the rank logs) as a page (timeline.html, one "
        "self-contained SVG: no script, nothing loaded) and a picture (timeline.png): a row "
        "per rank, the slowest marked, failures and world changes, the data-wait share.",
    )
    timeline.add_argument(
        "job_dir", metavar="JOB_DIR", help="the job's directory (holding trace.json), or the file"
    )
    timeline.add_argument(
        "--out", metavar="DIR", help="where the two files go (default: JOB_DIR, made if missing)"
    )


def _timeline(args: argparse.Namespace) -> int:
    from sparkdist.trace.format import FILE_NAME
    from sparkdist.trace.picture import Timeline

    try:
        timeline = Timeline.load(args.job_dir)
    except FileNotFoundError:
        return _timeline_error(f"no {FILE_NAME} in {args.job_dir} (give a job's directory)")
    except (OSError, ValueError) as exc:  # unreadable, or not JSON, or not a trace
        return _timeline_error(f"cannot read the trace in {args.job_dir}: {exc}")
    job_dir = args.job_dir if os.path.isdir(args.job_dir) else os.path.dirname(args.job_dir)
    out = args.out or job_dir or "."
    os.makedirs(out, exist_ok=True)
    html, png = (os.path.join(out, name) for name in TIMELINE_FILES)
    print(timeline.save_html(html))
    print(timeline.to_png(png))
    return EXIT_OK


def _timeline_error(message: str) -> int:
    print(f"sparkdist timeline: error: {message.splitlines()[0]}", file=sys.stderr)
    return EXIT_USAGE


# --- doctor and entrypoint ----------------------------------------------------------------


def _add_doctor(commands: _Commands) -> None:
    _command(commands, "doctor", "check Java, Spark, MPI, Horovod, frameworks, GPUs", _doctor)


def _doctor(args: argparse.Namespace) -> int:
    from sparkdist.doctor import report, run_checks

    text, healthy = report(run_checks())
    print(text)
    return 0 if healthy else 1


def _add_entrypoint(commands: _Commands) -> None:
    summary = "print the path to give spark-submit (see the README)"
    _command(commands, "entrypoint", summary, _entrypoint)


def _entrypoint(args: argparse.Namespace) -> int:
    print(os.path.abspath(__file__))
    return 0


if __name__ == "__main__":
    sys.exit(main())
