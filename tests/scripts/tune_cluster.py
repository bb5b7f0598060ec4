"""Driver for tests/tune/test_tune.py's 4-slot part: distributed trials on their own
local-cluster[2,2,1024] (the test session's Spark has 2 slots, and one SparkContext per
process is all pyspark allows).

Phase 1: two 2-rank torch trials at once, the second pruned at step 1 while its
rank 1 keeps training. Phase 2: 2-rank trials that run until the test sends SIGINT.
Each phase prints one `RESULT {json}` line.
"""

from __future__ import annotations

import json
import os
import sys
import time

import optuna

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers import build_spark  # noqa: E402

import sparkdist.tune  # noqa: E402

MARKERS = sys.argv[1]
STARTED = MARKERS + "-started"  # phase 1: one file per trial that has started


class PruneTrialOne(optuna.pruners.BasePruner):
    """Prunes trial 1 once it reported step 1: a pruner's answer the test can predict."""

    def prune(self, study, trial) -> bool:
        return trial.number == 1 and max(trial.intermediate_values, default=-1) >= 1


def _wait_until_both_started() -> None:
    """Neither trial ends before the other has started (or two minutes passed, when
    they could not run together): whether they ran at once is then decided by the
    scheduling alone, not by how fast each job starts on a loaded machine."""
    deadline = time.monotonic() + 120
    while len(os.listdir(STARTED)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)


def ddp_objective(trial):
    import time

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    lr = trial.suggest_float("lr", 0.01, 0.5, log=True)
    trial.set_user_attr(f"pid{rank}", os.getpid())
    if rank == 0:
        trial.set_user_attr("start", time.time())
        open(os.path.join(STARTED, str(trial.number)), "w").close()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x = torch.randn(64, 4)
    y = x.sum(dim=1, keepdim=True)
    for step in range(6):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        time.sleep(0.4)
        if rank == 0:
            trial.report(loss.item(), step)
            if trial.should_prune():
                _wait_until_both_started()
                trial.set_user_attr("end", time.time())
                raise optuna.TrialPruned()
    if rank == 0:
        _wait_until_both_started()
        trial.set_user_attr("end", time.time())
    dist.barrier()
    return loss.item()


def slow_objective(trial):
    import time

    rank = int(os.environ["RANK"])
    if trial.number == 0:
        return 1.0
    open(os.path.join(MARKERS, f"{trial.number}-{rank}-{os.getpid()}"), "w").close()
    time.sleep(300)
    return 0.0


def main() -> None:
    spark = build_spark("local-cluster[2,2,1024]")
    sc = spark.sparkContext

    os.makedirs(STARTED, exist_ok=True)
    study = optuna.create_study(pruner=PruneTrialOne())
    t0 = time.monotonic()
    sparkdist.tune.optimize(study, ddp_objective, n_trials=2, np=2, parallelism=2)
    trials = [
        {
            "number": t.number,
            "state": t.state.name,
            "value": t.value,
            "attrs": t.user_attrs,
            "steps": sorted(t.intermediate_values),
        }
        for t in study.trials
    ]
    print("RESULT " + json.dumps({"trials": trials, "wall": time.monotonic() - t0}), flush=True)

    study = optuna.create_study()
    t0 = time.monotonic()
    returned = sparkdist.tune.optimize(study, slow_objective, n_trials=6, np=2, parallelism=2)
    result = {
        "returned": returned is study,
        "states": [t.state.name for t in study.trials],
        "wall": time.monotonic() - t0,
        "active_jobs": list(sc.statusTracker().getActiveJobsIds()),
    }
    print("RESULT " + json.dumps(result), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
