"""The `sparkdist` command: demo, run (also under spark-submit), doctor."""

from __future__ import annotations

import argparse
import logging
import os
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

    if args.remote and args.master:
        raise SystemExit("sparkdist run: give --master or --remote, not both")
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
    try:
        runner = HorovodRunner(
            np=args.np,
            launcher=args.launcher,
            start_timeout=args.start_timeout,
            timeout=args.timeout,
            roles=args.roles,
            min_np=args.min_np,
            max_np=args.max_np,
            max_failures=args.max_failures,
            checkpoint_dir=args.checkpoint_dir,
        )
    except ValueError as exc:  # checked before any Spark starts
        print(f"sparkdist run: {exc}", file=sys.stderr)
        return 2
    spark = _session(args) if args.np > 0 else None
    try:
        runner.run(args.script, args=script_args)
    except SparkdistError as exc:
        print(f"sparkdist run: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
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
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from sparkdist.doctor import report, run_checks

    text, healthy = report(run_checks())
    print(text)
    return 0 if healthy else 1


def _entrypoint(args: argparse.Namespace) -> int:
    print(os.path.abspath(__file__))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparkdist", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser(
        "demo",
        help="every path end to end on an embedded Spark: DDP, Horovod, TensorFlow, ensembles",
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

    run = commands.add_parser(
        "run",
        help="run a training script on N ranks",
        description="Run SCRIPT on N ranks as __main__; arguments after -- go to the script. "
        "With --remote (or SPARK_REMOTE) it runs through that Spark Connect server; under "
        "spark-submit it uses that Spark; otherwise --master, else an embedded Spark.",
    )
    run.add_argument("--np", type=int, required=True, help="ranks (<0: on the driver)")
    run.add_argument("--master", help="Spark master URL (default: spark-submit's or embedded)")
    run.add_argument(
        "--remote", help="a Spark Connect URL, sc://host:port (default: env SPARK_REMOTE)"
    )
    run.add_argument("--executors", type=int, default=2, help="executors of an embedded Spark")
    run.add_argument("--launcher", default="auto", choices=["auto", "mpi", "direct"])
    run.add_argument("--start-timeout", type=float, default=600.0)
    run.add_argument("--timeout", type=float, default=None)
    run.add_argument("--min-np", type=int, help="elastic: start with at least this many ranks")
    run.add_argument("--max-np", type=int, help="elastic: grow up to this many ranks")
    run.add_argument(
        "--max-failures", type=int, default=0, help="relaunches after a lost executor or rank"
    )
    run.add_argument("--checkpoint-dir", help="where sparkdist.checkpoint keeps checkpoints")
    run.add_argument(
        "--roles",
        help="a parameter-server job's roles, e.g. chief=1,worker=2,ps=1 (they add up to --np)",
    )
    run.add_argument("script", help="the Python training script")
    run.add_argument("script_args", nargs=argparse.REMAINDER, help="-- then the script's arguments")
    run.set_defaults(func=_run)

    doctor = commands.add_parser("doctor", help="check Java, Spark, MPI, Horovod, frameworks, GPUs")
    doctor.set_defaults(func=_doctor)

    entry = commands.add_parser(
        "entrypoint", help="print the path to give spark-submit (see the README)"
    )
    entry.set_defaults(func=_entrypoint)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
