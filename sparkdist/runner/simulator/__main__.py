"""`python -m sparkdist.runner.simulator [--ranks 16,64,256,1024] [--payload-budget-gb 4]`:
the simulated scale curve, printed as a table (`curve.py`)."""

from __future__ import annotations

import argparse

from sparkdist.runner.simulator.curve import CURVE_RANKS, PAYLOAD_BUDGET, curve, print_table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m sparkdist.runner.simulator", description=__doc__
    )
    parser.add_argument(
        "--ranks",
        default=",".join(map(str, CURVE_RANKS)),
        help="world sizes, comma-separated (8 ranks per simulated host)",
    )
    parser.add_argument(
        "--payload-budget-gb",
        type=float,
        default=PAYLOAD_BUDGET / 2**30,
        help="measure a payload only while its bytes to every rank stay under this",
    )
    args = parser.parse_args(argv)
    ranks = [int(n) for n in args.ranks.split(",")]
    print_table(curve(ranks, payload_budget=int(args.payload_budget_gb * 2**30)))


if __name__ == "__main__":
    main()
