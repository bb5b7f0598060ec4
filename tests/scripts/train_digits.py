"""A training script as users write them: argparse, DDP, rank 0 writes the result."""

import argparse
import json
import os

from sparkdist.demos.digits import train_digits_ddp

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--out", required=True)
parser.add_argument("--fail-on-rank", type=int, default=-1)
args = parser.parse_args()

if int(os.environ["RANK"]) == args.fail_on_rank:
    raise SystemExit(3)

result = train_digits_ddp(epochs=args.epochs)
if int(os.environ["RANK"]) == 0:
    with open(args.out, "w") as f:
        json.dump(result, f)
