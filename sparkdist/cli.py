"""The `sparkdist` command."""

from __future__ import annotations

import argparse
import logging
import sys
import time


def _demo(args: argparse.Namespace) -> int:
    from sparkdist import HorovodRunner
    from sparkdist.demos.digits import train_digits_ddp
    from sparkdist.session import embedded_spark

    started = time.monotonic()
    print(f"Starting an embedded Spark with {args.executors} executors ...", flush=True)
    spark = embedded_spark(executors=args.executors, app_name="sparkdist-demo")
    spark_ready = time.monotonic()
    print(f"Spark ready in {spark_ready - started:.1f}s: {spark.sparkContext.master}", flush=True)
    print(f"Training a torch model on digits with DDP over {args.np} ranks ...", flush=True)
    runner = HorovodRunner(np=args.np)
    result = runner.run(train_digits_ddp, epochs=args.epochs)
    job_time = time.monotonic() - spark_ready
    print()
    print(f"ranks:          {result['ranks']} ({runner.last_job.launcher} launcher)")
    print(f"test accuracy:  {result['accuracy']:.4f}")
    print(f"training job:   {job_time:.1f}s wall time (Spark start-up {spark_ready - started:.1f}s)")
    if result["accuracy"] < 0.9:
        print("demo FAILED: accuracy below 0.9", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparkdist", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="train on digits with 2 ranks on an embedded Spark")
    demo.add_argument("--np", type=int, default=2, help="number of ranks (default 2)")
    demo.add_argument("--executors", type=int, default=2, help="executors of the embedded Spark")
    demo.add_argument("--epochs", type=int, default=20)
    demo.set_defaults(func=_demo)
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
