"""NCCL's flight recorder on a stall (issue 48): needs a GPU, so it is skipped elsewhere
and runs in `make gpu-check` wherever one is (one rank on the driver: NCCL refuses two
ranks of one communicator on one GPU). The environment and command logic it relies on
is unit-tested in tests/test_stacks.py."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from sparkdist import HorovodRunner
from sparkdist.errors import JobStalledError
from sparkdist.protocol.stack_dumps import NCCL_PREFIX
from sparkdist.runner.driver.stalls import NCCL_COMMAND

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def nccl_then_silent() -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl")
    value = torch.ones(1, device="cuda")
    for _ in range(5):
        dist.all_reduce(value)
    torch.cuda.synchronize()
    print("reduced", flush=True)
    while True:
        time.sleep(1)


def test_a_stall_dumps_the_nccl_flight_recorder_and_names_the_command():
    runner = HorovodRunner(np=-1, launcher="direct", stall_timeout=8, stall_warning=None)
    with pytest.raises(JobStalledError) as failed:
        runner.run(nccl_then_silent)
    message = str(failed.value)
    assert "NCCL flight recorder dumps:" in message, message
    directory = Path(runner.last_job.rank_logs)
    dump = directory / f"{NCCL_PREFIX}0"
    assert dump.stat().st_size > 0
    command = NCCL_COMMAND.format(directory=directory)
    assert command in message
    if shutil.which("torchfrtrace"):
        done = subprocess.run(command.split(), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
