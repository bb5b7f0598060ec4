"""The `sparkdist` command: demo, run (also under spark-submit), doctor."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys


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


def _run(args: argparse.Namespace) -> int:
    from sparkdist import HorovodRunner
    from sparkdist.errors import SparkdistError
    from sparkdist.spark.session import stop_session

    script_args = list(args.script_args)
    if script_args[:1] == ["--"]:
        script_args = script_args[1:]
    if os.path.isdir(args.script):
        return _usage_error(f"{args.script} is a directory: give the training script's path")
    if not os.path.isfile(args.script):
        return _usage_error(f"no such script: {args.script}")
    if not os.access(args.script, os.R_OK):
        return _usage_error(f"cannot read the script {args.script} (permissions)")
    if args.remote and args.master:
        return _usage_error("give --master or --remote, not both")
    try:
        runner = HorovodRunner(
            np=args.np,
            driver_log_verbosity=args.driver_log_verbosity,
            launcher=args.launcher,
            start_timeout=args.start_timeout,
            timeout=args.timeout,
            env=dict(args.env),
            mpi_args=args.mpi_args,
            network_interface=args.network_interface,
            timeline=args.timeline,
            max_failures=args.max_failures,
            retry_on_exception=args.retry_on_exception,
            checkpoint_dir=args.checkpoint_dir,
            ranks_per_task=args.ranks_per_task,
            roles=args.roles,
            min_np=args.min_np,
            max_np=args.max_np,
            report_ranks=args.report_ranks,
        )
    except ValueError as exc:  # checked before any Spark starts
        return _usage_error(str(exc))
    spark = _session(args) if args.np > 0 else None
    try:
        runner.run(args.script, args=script_args)
    except SparkdistError as exc:
        print(f"sparkdist run: {type(exc).__name__}: {exc}", file=sys.stderr)
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
    return EXIT_OK


def _usage_error(message: str) -> int:
    print(f"sparkdist run: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _doctor(args: argparse.Namespace) -> int:
    from sparkdist.doctor import report, run_checks

    text, healthy = report(run_checks())
    print(text)
    return 0 if healthy else 1


def _entrypoint(args: argparse.Namespace) -> int:
    print(os.path.abspath(__file__))
    return 0


EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_CODES = """exit codes:
  0    success (doctor: every required check passed)
  1    the job failed: a rank raised or exited non-zero, a rank or executor was lost,
       a time limit ran out, too few task slots (doctor: a required check failed)
  2    bad usage: an unknown or invalid option, a missing or unreadable script;
       reported in one line before Spark starts
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
    sub = _global_options(defaults=False)

    def command(name: str, help: str, **kwargs) -> argparse.ArgumentParser:
        return commands.add_parser(
            name,
            help=help,
            parents=[sub],
            epilog=EXIT_CODES,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            **kwargs,
        )

    demo = command(
        "demo", "every path end to end on an embedded Spark: DDP, Horovod, TensorFlow, ensembles"
    )
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
    demo.set_defaults(func=_demo)

    run = command(
        "run",
        "run a training script on N ranks",
        description="Run SCRIPT on N ranks as __main__; arguments after -- go to the script. "
        "With --remote (or SPARK_REMOTE) it runs through that Spark Connect server; under "
        "spark-submit it uses that Spark; otherwise --master, else an embedded Spark. "
        "Every option is HorovodRunner's of the same name.",
    )
    run.add_argument(
        "--np",
        type=int,
        required=True,
        help="ranks: N > 0 on the cluster, N < 0 as -N processes here",
    )
    run.add_argument("--master", help="Spark master URL (default: spark-submit's or embedded)")
    run.add_argument(
        "--remote", help="a Spark Connect URL, sc://host:port (default: env SPARK_REMOTE)"
    )
    run.add_argument(
        "--executors", type=int, default=2, help="executors of an embedded Spark (default 2)"
    )
    run.add_argument(
        "--launcher",
        default="auto",
        choices=["auto", "mpi", "direct"],
        help="mpi: mpirun in the stage; direct: each task starts its ranks; "
        "auto (default): mpi when mpirun is installed",
    )
    run.add_argument(
        "--start-timeout",
        type=_positive_seconds,
        default=600.0,
        metavar="S",
        help="seconds for the job to get its slots and start every rank (default 600)",
    )
    run.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=None,
        metavar="S",
        help="seconds for the whole job (default: no limit)",
    )
    run.add_argument(
        "--driver-log-verbosity",
        default="all",
        choices=["all", "log_callback_only"],
        help="all (default): every rank's output, prefixed with its rank; "
        "log_callback_only: only sparkdist.log_to_driver lines and errors",
    )
    run.add_argument(
        "--env",
        type=_key_value,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the ranks (repeatable)",
    )
    run.add_argument(
        "--mpi-args",
        type=shlex.split,
        default=[],
        metavar="ARGS",
        help='extra mpirun arguments as one string, e.g. "--mca btl_tcp_links 2"',
    )
    run.add_argument(
        "--network-interface",
        metavar="IFACE",
        help="the interface the ranks and sparkdist's channels use (e.g. eth0; "
        "default: the one carrying each executor's address)",
    )
    run.add_argument(
        "--timeline",
        metavar="PATH",
        help="write a Horovod timeline of the job here (default: env HOROVOD_TIMELINE)",
    )
    run.add_argument(
        "--ranks-per-task",
        type=int,
        default=1,
        metavar="K",
        help="ranks each Spark task starts; --np must be a multiple (default 1)",
    )
    run.add_argument("--min-np", type=int, help="elastic: start with at least this many ranks")
    run.add_argument("--max-np", type=int, help="elastic: grow up to this many ranks")
    run.add_argument(
        "--max-failures",
        type=int,
        default=None,
        help="relaunches after a lost executor or rank (default 0; no limit with "
        "--min-np/--max-np)",
    )
    run.add_argument(
        "--retry-on-exception",
        action="store_true",
        help="also relaunch when the script itself raised",
    )
    run.add_argument("--checkpoint-dir", help="where sparkdist.checkpoint keeps checkpoints")
    run.add_argument(
        "--roles",
        help="a parameter-server job's roles, e.g. chief=1,worker=2,ps=1 (they add up to --np)",
    )
    run.add_argument(
        "--report-ranks",
        default="rank0",
        choices=["rank0", "all"],
        help="whose sparkdist.report metrics are shown and logged to MLflow (default rank0)",
    )
    run.add_argument("script", help="the Python training script")
    run.add_argument("script_args", nargs=argparse.REMAINDER, help="-- then the script's arguments")
    run.set_defaults(func=_run)

    doctor = command("doctor", "check Java, Spark, MPI, Horovod, frameworks, GPUs")
    doctor.set_defaults(func=_doctor)

    entry = command("entrypoint", "print the path to give spark-submit (see the README)")
    entry.set_defaults(func=_entrypoint)
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


if __name__ == "__main__":
    sys.exit(main())
