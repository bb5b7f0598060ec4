"""Check 9 of `make gpu-check`, and tests/test_nccl_flight_recorder.py (issue 48): a
one-rank NCCL job on the driver goes silent after collectives; `stall_timeout` ends it,
NCCL's flight recorder dump lands in the rank log directory, and the error names the
command that analyses it. One place for the scenario, so the check and the pytest test
cannot drift apart. Needs CUDA: NCCL refuses two ranks of one communicator on one GPU."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

STALL_TIMEOUT_S = 8


def nccl_then_silent() -> None:
    """The rank: five all_reduces on the GPU, one line, then silence."""
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


def check_nccl_stall() -> str:
    """Run the stalled job; raise AssertionError if the dump or the command is missing.
    The figure: the dump's size, and whether `torchfrtrace` (if installed) read it."""
    import cloudpickle

    from sparkdist import HorovodRunner
    from sparkdist.errors import JobStalledError
    from sparkdist.protocol.stack_dumps import NCCL_PREFIX
    from sparkdist.runner.driver.stalls import NCCL_COMMAND

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks need not import it
    runner = HorovodRunner(
        np=-1, launcher="direct", stall_timeout=STALL_TIMEOUT_S, stall_warning=None
    )
    try:
        runner.run(nccl_then_silent)
    except JobStalledError as exc:
        message = str(exc)
    else:
        raise AssertionError("the silent job was not called stalled")
    if "NCCL flight recorder dumps:" not in message:
        raise AssertionError(f"no flight recorder dumps named: {message}")
    directory = Path(runner.last_job.rank_logs)
    size = (directory / f"{NCCL_PREFIX}0").stat().st_size
    if size == 0:
        raise AssertionError(f"an empty dump in {directory}")
    command = NCCL_COMMAND.format(directory=directory)
    if command not in message:
        raise AssertionError(f"{command!r} not in the error: {message}")
    if not shutil.which("torchfrtrace"):
        return f"dump {size} bytes; torchfrtrace not installed"
    done = subprocess.run(command.split(), capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise AssertionError(f"{command} exited {done.returncode}: {done.stderr[-600:]}")
    return f"dump {size} bytes; torchfrtrace read it"
