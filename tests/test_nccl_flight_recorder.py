"""NCCL's flight recorder on a stall (issue 48): needs a GPU, so it is skipped elsewhere.
The scenario lives in tests/gpu/stall_check.py, which `make gpu-check` runs as check 9
(one rank on the driver: NCCL refuses two ranks of one communicator on one GPU). The
environment and command logic it relies on is unit-tested in tests/runner/test_stacks.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))

import stall_check  # noqa: E402


def test_a_stall_dumps_the_nccl_flight_recorder_and_names_the_command():
    stall_check.check_nccl_stall()
