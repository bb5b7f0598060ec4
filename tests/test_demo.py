"""The main job: `sparkdist demo` trains DDP on digits with 2 ranks on Spark."""

from __future__ import annotations

import re

from sparkdist import cli


def test_demo_trains_digits_with_two_ranks(spark, capfd):
    assert cli.main(["demo", "--epochs", "12"]) == 0
    out, _ = capfd.readouterr()
    epochs = re.findall(
        r"^\[rank 0\] epoch +(\d+) +loss ([\d.]+) +test accuracy ([\d.]+)$", out, re.M
    )
    assert [int(e) for e, _, _ in epochs] == list(range(1, 13))
    losses = [float(loss) for _, loss, _ in epochs]
    assert losses[-1] < losses[0] / 3
    accuracy = float(re.search(r"^test accuracy: +([\d.]+)$", out, re.M).group(1))
    assert accuracy >= 0.9
    assert re.search(r"^ranks: +2 \(mpi launcher\)$", out, re.M)
    assert re.search(r"^training job: +[\d.]+s wall time", out, re.M)
