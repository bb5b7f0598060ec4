"""A rank's start does not count against `stall_timeout` (issue 64's soak: with
`stall_timeout=10` on a loaded machine every rank imported torch for longer, and the job
failed at its start): a rank is starting until its first sign of life, and that is bounded
by `start_timeout` instead (`stalls.StallClock`). On the driver (np < 0, no Spark); the
in-process elastic world's case is in tests/elastic/test_elastic_stopped_rank.py.

Before the fix, the first test failed with `JobStalledError` at `stall_timeout` after rank
0's line (rank 1 still in its import), and the second one at `stall_timeout` itself.
"""

from __future__ import annotations

import re

import pytest
import stall_jobs
from helpers import assert_nothing_left

from sparkdist import HorovodRunner
from sparkdist.errors import JobStalledError

STALL_TIMEOUT_S = 3
SLOW_START_S = 3 * STALL_TIMEOUT_S


def write_slow_module(directory, seconds: float) -> str:
    """A module whose import sleeps `seconds` (`stall_jobs.slow_import`)."""
    (directory / "slow_start.py").write_text(f"import time\n\ntime.sleep({seconds})\n")
    return str(directory)


def test_a_rank_slow_to_start_is_no_stall(tmp_path):
    """Rank 1's import sleeps three stall timeouts; rank 0 printed its line and waits for
    it in silence. Nothing is stalled while a rank starts: the job ends well."""
    runner = HorovodRunner(np=-2, launcher="direct", stall_timeout=STALL_TIMEOUT_S)
    ranks = runner.run_all(
        stall_jobs.slow_start, module_dir=write_slow_module(tmp_path, SLOW_START_S)
    )
    assert ranks == [0, 1]
    assert runner.last_job.failures == []
    assert_nothing_left(runner)


def test_a_rank_silent_past_start_timeout_is_stalled():
    """A rank that never shows a sign of life is starting for `start_timeout` only; then
    it is silent since its start, and a `stall_timeout` given fails the job."""
    start_timeout = 4 * STALL_TIMEOUT_S
    runner = HorovodRunner(
        np=-1, launcher="direct", stall_timeout=STALL_TIMEOUT_S, start_timeout=start_timeout
    )
    with pytest.raises(JobStalledError) as failed:
        runner.run(stall_jobs.silent_forever)
    idle = re.search(r"no rank showed a sign of life for (\d+)s", str(failed.value))
    assert idle and int(idle.group(1)) >= start_timeout, str(failed.value)
    assert "silent_forever (stall_jobs.py:" in failed.value.stacks, failed.value.stacks
    assert_nothing_left(runner)
