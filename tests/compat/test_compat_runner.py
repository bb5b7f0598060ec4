"""The runner on a runtime's stack: its Spark (barrier stages, 3.5 or 4.x), its Python, its
cloudpickle (the payload, the result, and the rank's traceback with its source line)."""

from __future__ import annotations

import pytest

from sparkdist import HorovodRunner, RankFailedError

# (np, launcher): ranks in barrier tasks through mpirun and without it, and np < 0 (ranks as
# subprocesses of the driver).
PLACEMENTS = [(2, "mpi"), (2, "direct"), (-2, "mpi")]


@pytest.mark.parametrize(("np_", "launcher"), PLACEMENTS)
def test_every_rank_runs_and_returns_on_the_runtime_stack(sc, np_, launcher):
    import numpy as np
    import pandas as pd

    def main(scale):
        import os
        import sys

        import numpy as np
        import pandas as pd

        rank = int(os.environ["RANK"])
        return {
            "rank": rank,
            "size": int(os.environ["WORLD_SIZE"]),
            "python": sys.version_info[:2],
            "numpy": np.__version__,
            "array": np.arange(3) * scale + rank,
            "frame": pd.DataFrame({"rank": [rank], "scaled": [rank * scale]}),
        }

    runner = HorovodRunner(np=np_, launcher=launcher, start_timeout=120, timeout=300)
    results = runner.run_all(main, scale=2.0)
    import sys

    assert [r["rank"] for r in results] == [0, 1]
    assert {r["size"] for r in results} == {2}
    assert {tuple(r["python"]) for r in results} == {sys.version_info[:2]}
    assert {r["numpy"] for r in results} == {np.__version__}
    np.testing.assert_array_equal(results[1]["array"], np.array([1.0, 3.0, 5.0]))
    pd.testing.assert_frame_equal(results[1]["frame"], pd.DataFrame({"rank": [1], "scaled": [2.0]}))
    assert runner.last_job.outcome == "succeeded"


@pytest.mark.parametrize(("np_", "launcher"), [(2, "mpi"), (-2, "direct")])
def test_failing_rank_traceback_reaches_driver_with_its_source_line(sc, np_, launcher):
    def main():
        import os
        import time

        if os.environ["RANK"] == "1":
            raise ValueError("boom from rank one")
        time.sleep(600)  # rank 0 waits: the failure must stop the job

    runner = HorovodRunner(np=np_, launcher=launcher, start_timeout=120, timeout=300)
    with pytest.raises(RankFailedError) as info:
        runner.run(main)
    error = info.value
    assert error.rank == 1 and error.exit_code == 1
    assert "ValueError: boom from rank one" in error.traceback
    # The line itself, whatever cloudpickle did to the function's file name (3.1.3 rewrites
    # it to "<dynamic-code>").
    assert 'raise ValueError("boom from rank one")' in error.traceback
    assert runner.last_job.outcome == "failed"
