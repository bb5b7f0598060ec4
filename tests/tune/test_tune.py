"""sparkdist.tune: Optuna trials run on real Spark, single-node (long-lived worker tasks,
on the session's 2-slot local-cluster) and distributed (2-rank runner jobs, on a 4-slot
local-cluster in a driver subprocess, since a process holds one SparkContext)."""

from __future__ import annotations

import _thread
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from helpers import sleeps_unless_first

import sparkdist.tune
from sparkdist.tune import TooManyFailedTrialsError

optuna.logging.set_verbosity(optuna.logging.WARNING)
TESTS = Path(__file__).parents[1]


def quadratic(trial):
    import time

    x = trial.suggest_float("x", -4.0, 4.0)
    kind = trial.suggest_categorical("kind", ["a", "b"])
    start = time.time()
    time.sleep(1.0)
    trial.set_user_attr("span", [start, time.time()])
    trial.set_user_attr("pid", os.getpid())
    return (x - 1.0) ** 2 + (0.5 if kind == "b" else 0.0)


def test_single_node_trials_run_in_parallel(sc):
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0))
    returned = sparkdist.tune.optimize(study, quadratic, n_trials=4)
    assert returned is study
    trials = study.trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4
    # Each trial ran in a Spark task, not on the driver, and two of them at once.
    assert all(t.user_attrs["pid"] != os.getpid() for t in trials)
    spans = sorted(t.user_attrs["span"] for t in trials)
    assert any(a[1] > b[0] for a, b in zip(spans, spans[1:], strict=False))
    best = min(trials, key=lambda t: t.value)
    assert study.best_trial.number == best.number
    assert set(study.best_params) == {"x", "kind"}
    assert len(study.trials_dataframe()) == 4


def wait_for_two_workers(trial, rendezvous: str) -> None:
    """Trial 0 waits (up to 60 s) until a trial has started in another process, so both
    workers of the job run trials whatever the machine's load."""
    import os
    import time

    open(os.path.join(rendezvous, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 60
    while trial.number == 0 and len(os.listdir(rendezvous)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)


def where_it_ran(trial, rendezvous: str):
    """Records the Spark task that ran the trial; trial 3 fails."""
    import os

    from pyspark import TaskContext

    x = trial.suggest_float("x", 0.0, 1.0)
    context = TaskContext.get()
    trial.set_user_attr("task", [context.stageId(), context.partitionId(), os.getpid()])
    wait_for_two_workers(trial, rendezvous)
    if trial.number == 3:
        raise ValueError("trial 3 fails")
    return x


def test_trials_run_in_one_job_of_long_lived_tasks(sc, tmp_path):
    def objective(trial):
        return where_it_ran(trial, str(tmp_path))

    study = optuna.create_study()
    sparkdist.tune.optimize(study, objective, n_trials=8, parallelism=2)
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE"] * 3 + ["FAIL"] + ["COMPLETE"] * 4
    assert "ValueError: trial 3 fails" in study.trials[3].user_attrs["traceback"]
    tasks = [tuple(t.user_attrs["task"]) for t in study.trials]
    # One stage (so one Spark job) of two tasks, each a worker process running trial
    # after trial; the worker whose trial failed ran the next ones too.
    assert len({stage for stage, _, _ in tasks}) == 1
    assert {part for _, part, _ in tasks} == {0, 1}
    assert len({pid for _, _, pid in tasks}) == 2
    failed_worker = tasks[3][2]
    assert any(pid == failed_worker for _, _, pid in tasks[4:])


def dies_on_trial_one(trial):
    import os
    import signal

    x = trial.suggest_float("x", 0.0, 1.0)
    if trial.number == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # the Python worker dies, as on a lost executor
    return x


def test_lost_task_fails_its_trial_and_the_rest_run(sc):
    study = optuna.create_study()
    sparkdist.tune.optimize(study, dies_on_trial_one, n_trials=5, parallelism=2)
    states = {t.number: t.state.name for t in study.trials}
    assert states == {0: "COMPLETE", 1: "FAIL", 2: "COMPLETE", 3: "COMPLETE", 4: "COMPLETE"}
    assert "ended before the trial did" in study.trials[1].user_attrs["traceback"]


def dies_on_trials_one_to_four(trial):
    import os
    import signal

    x = trial.suggest_float("x", 0.0, 1.0)
    if 1 <= trial.number <= 4:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def test_failed_job_is_followed_by_a_new_one_for_the_rest(sc):
    # One worker task, lost 4 times: Spark gives up on the job (spark.task.maxFailures=4),
    # and a new job runs the remaining trials.
    study = optuna.create_study()
    sparkdist.tune.optimize(study, dies_on_trials_one_to_four, n_trials=7, parallelism=1)
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE"] + ["FAIL"] * 4 + ["COMPLETE"] * 2


def test_shared_value_is_fetched_once_per_worker_process(sc):
    import cloudpickle
    import numpy as np

    array = np.arange(2_000_000, dtype=np.float64)  # 16 MB
    data = sparkdist.tune.share({"array": array})

    def objective(trial):
        import os

        value = data.value
        trial.set_user_attr("seen", [os.getpid(), id(value), float(value["array"].sum())])
        return trial.suggest_float("x", 0, 1)

    # The objective travels without the value: only the handle's key.
    assert len(cloudpickle.dumps(objective)) < 20_000
    study = optuna.create_study()
    sparkdist.tune.optimize(study, objective, n_trials=6, parallelism=2)
    seen = [t.user_attrs["seen"] for t in study.trials]
    assert all(total == float(array.sum()) for _, _, total in seen)
    # Every trial of a worker process read the same object: fetched once, then cached.
    by_pid = {}
    for pid, object_id, _ in seen:
        by_pid.setdefault(pid, set()).add(object_id)
    assert all(len(ids) == 1 for ids in by_pid.values())
    assert data.value["array"] is array  # on the driver, the driver's own object


def test_broadcast_works_on_classic_single_node_and_is_refused_for_ranks(sc):
    data = sc.broadcast([1.0, 2.0, 3.0])

    def objective(trial):
        return sum(data.value) + trial.suggest_float("x", 0, 1)

    study = optuna.create_study()
    sparkdist.tune.optimize(study, objective, n_trials=2)
    assert all(6.0 <= t.value <= 7.0 for t in study.trials)
    with pytest.raises(sparkdist.SparkdistError, match="sparkdist.tune.share") as info:
        sparkdist.tune.optimize(study, objective, n_trials=1, np=2)
    assert "broadcast variable data" in str(info.value)
    assert len(study.trials) == 2


def failing_on_odd(trial):
    x = trial.suggest_int("x", 0, 10)
    if trial.number % 2:
        raise ValueError(f"odd trial {trial.number} with x={x}")
    return float(x)


def test_failing_trial_recorded_with_traceback(sc):
    study = optuna.create_study()
    sparkdist.tune.optimize(study, failing_on_odd, n_trials=4, parallelism=2)
    states = {t.number: t.state.name for t in study.trials}
    assert states == {0: "COMPLETE", 1: "FAIL", 2: "COMPLETE", 3: "FAIL"}
    failed = study.trials[1]
    assert "ValueError: odd trial 1 with x=" in failed.user_attrs["traceback"]
    assert "failing_on_odd" in failed.user_attrs["traceback"]


def always_fails(trial):
    trial.suggest_float("x", 0, 1)
    raise RuntimeError("broken objective")


def test_max_failed_trials_stops_the_search(sc):
    study = optuna.create_study()
    with pytest.raises(TooManyFailedTrialsError, match="more than max_failed_trials=1") as info:
        sparkdist.tune.optimize(study, always_fails, n_trials=10, max_failed_trials=1)
    assert "RuntimeError: broken objective" in str(info.value)
    assert len(study.trials) < 10
    assert all(t.state.name == "FAIL" for t in study.trials)


def reports_steps(trial):
    import optuna

    x = trial.suggest_float("x", 0.0, 1.0)
    for step in range(5):
        trial.report(x + 1.0 / (step + 1), step)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return x


def test_pruned_single_node_trial_ends_early(sc):
    study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=1.2))
    study.enqueue_trial({"x": 0.9})  # 0.9 + 1/(step+1) > 1.2 until step 3
    study.enqueue_trial({"x": 0.1})  # under the threshold from step 0
    sparkdist.tune.optimize(study, reports_steps, n_trials=2)
    pruned, complete = study.trials
    assert pruned.state.name == "PRUNED" and sorted(pruned.intermediate_values) == [0]
    assert complete.state.name == "COMPLETE" and sorted(complete.intermediate_values) == [
        0,
        1,
        2,
        3,
        4,
    ]


def test_bad_arguments_fail_early(sc):
    study = optuna.create_study()
    with pytest.raises(ValueError, match="n_trials must be an int >= 1"):
        sparkdist.tune.optimize(study, quadratic, n_trials=0)
    with pytest.raises(ValueError, match="objective must be a function"):
        sparkdist.tune.optimize(study, "quadratic", n_trials=1)
    with pytest.raises(sparkdist.SparkdistError, match="np=3 ranks per trial need 3 task slots"):
        sparkdist.tune.optimize(study, quadratic, n_trials=1, np=3)
    assert study.trials == []


def sleeps_four_seconds(trial):
    import time

    time.sleep(4.0)
    return trial.suggest_float("x", 0, 1)


def test_timeout_starts_no_new_trial(sc):
    study = optuna.create_study()
    sparkdist.tune.optimize(study, sleeps_four_seconds, n_trials=20, timeout=3.0)
    # Each of the 2 workers started a trial before the time ran out (its task starts in
    # well under 3 s) and finished it; none started another after 4 s.
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]


def test_objective_that_cannot_travel_fails_at_once(sc):
    lock = threading.Lock()

    def objective(trial):
        with lock:
            return trial.suggest_float("x", 0, 1)

    study = optuna.create_study()
    with pytest.raises(sparkdist.PayloadError, match="lock"):
        sparkdist.tune.optimize(study, objective, n_trials=2)
    assert study.trials == []  # refused before any trial started


def test_keyboard_interrupt_cancels_running_trials(sc):
    study = optuna.create_study()

    def interrupt_when_both_run():
        while sum(t.user_attrs.get("started", False) for t in study.get_trials()) < 2:
            time.sleep(0.2)
        _thread.interrupt_main()  # what Ctrl-C (or a notebook's stop button) does

    threading.Thread(target=interrupt_when_both_run, daemon=True).start()
    start = time.monotonic()
    returned = sparkdist.tune.optimize(study, sleeps_unless_first, n_trials=5)
    assert time.monotonic() - start < 120
    assert returned is study
    assert [t.state.name for t in study.trials] == ["COMPLETE", "FAIL", "FAIL"]
    assert "cancelled" in study.trials[1].user_attrs["traceback"]
    # The job ended (Spark's status tracker hears of it through its listener bus).
    deadline = time.monotonic() + 30
    while list(sc.statusTracker().getActiveJobsIds()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(sc.statusTracker().getActiveJobsIds()) == []


def test_mlflow_parent_and_child_runs(sc, driver_mlflow):
    mlflow = driver_mlflow
    mlflow.set_experiment("tune-test")
    study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=1.2))
    study.enqueue_trial({"x": 0.9})
    study.enqueue_trial({"x": 0.1})
    with mlflow.start_run() as parent:
        sparkdist.tune.optimize(study, reports_steps, n_trials=2)
    client = mlflow.MlflowClient()
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    by_trial = {int(r.data.tags["sparkdist.tune.trial"]): r for r in children}
    assert sorted(by_trial) == [0, 1]
    assert by_trial[0].info.status == "KILLED" and by_trial[1].info.status == "FINISHED"
    assert by_trial[1].data.params == {"x": "0.1"}
    assert by_trial[1].data.metrics["value"] == pytest.approx(0.1)
    history = client.get_metric_history(by_trial[1].info.run_id, "intermediate_value")
    assert [m.step for m in history] == [0, 1, 2, 3, 4]
    parent_run = client.get_run(parent.info.run_id)
    assert parent_run.data.metrics["best_value"] == pytest.approx(0.1)


RESUME_DRIVER = """
import sys, optuna, sparkdist.tune
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
study = optuna.create_study(study_name="resume", storage=sys.argv[1], load_if_exists=True,
                            sampler=optuna.samplers.RandomSampler(seed=1))
def objective(trial):
    return trial.suggest_float("x", -1, 1) ** 2
sparkdist.tune.optimize(study, objective, n_trials=3)
spark.stop()
"""


def test_resume_from_sqlite_storage(sc, tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), *sys.path])}
    # The first driver runs 3 trials and exits; this process is the restarted driver.
    subprocess.run([sys.executable, "-c", RESUME_DRIVER, storage], env=env, check=True, timeout=240)
    study = optuna.load_study(study_name="resume", storage=storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    first_best = study.best_value
    sparkdist.tune.optimize(study, quadratic, n_trials=2)
    study = optuna.load_study(study_name="resume", storage=storage)
    assert [t.number for t in study.trials] == [0, 1, 2, 3, 4]
    assert all(t.state.name == "COMPLETE" for t in study.trials)
    assert study.best_value <= first_best


def _gone(pid: int, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def test_distributed_trials_two_at_once_pruned_and_interrupted(tmp_path):
    """2-rank torch trials on 4 slots: two at once, one pruned (its ranks gone), then a
    search interrupted with SIGINT while two 2-rank trials run."""
    pytest.importorskip("torch")
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), *sys.path])}
    out = tmp_path / "out.txt"
    with open(out, "w") as stdout, open(tmp_path / "err.txt", "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(TESTS / "scripts" / "tune_cluster.py"), str(markers)],
            env=env,
            stdout=stdout,
            stderr=stderr,
        )
        try:
            deadline = time.monotonic() + 300
            while len(list(markers.iterdir())) < 4 and proc.poll() is None:
                assert time.monotonic() < deadline, (tmp_path / "err.txt").read_text()[-3000:]
                time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results = [
        json.loads(line[7:]) for line in out.read_text().splitlines() if line.startswith("RESULT ")
    ]
    assert len(results) == 2, (tmp_path / "err.txt").read_text()[-3000:]
    search, interrupted = results

    trials = {t["number"]: t for t in search["trials"]}
    assert [trials[n]["state"] for n in range(2)] == ["COMPLETE", "PRUNED"]
    # Trials 0 and 1 ran at the same time, each on its own 2 ranks.
    assert trials[1]["attrs"]["start"] < trials[0]["attrs"]["end"]
    assert trials[0]["attrs"]["start"] < trials[1]["attrs"]["end"]
    pids = [trials[n]["attrs"][f"pid{r}"] for n in (0, 1) for r in (0, 1)]
    assert len(set(pids)) == 4
    # The pruned trial stopped at step 1 of 6, and both its ranks are gone.
    assert trials[1]["steps"] == [0, 1]
    assert trials[0]["steps"] == list(range(6))
    assert all(_gone(trials[1]["attrs"][f"pid{r}"]) for r in (0, 1))

    assert interrupted["returned"] is True
    assert interrupted["states"][0] == "COMPLETE"
    assert interrupted["states"][1:] == ["FAIL"] * (len(interrupted["states"]) - 1)
    assert interrupted["active_jobs"] == []
    rank_pids = [int(p.name.rsplit("-", 1)[1]) for p in markers.iterdir()]
    assert all(_gone(pid) for pid in rank_pids)


LIMIT = 7.5


def _objective_with_limit(trial, limit):
    return trial.suggest_float("x", 0, limit) + LIMIT


class _CallableObjective:
    def __init__(self, data):
        self.data = data

    def __call__(self, trial):
        return trial.suggest_float("x", 0, LIMIT) + len(self.data)


def test_what_an_objective_reads_is_found_in_partials_and_callable_objects():
    """The Connect/broadcast checks see through `functools.partial` and objects with
    `__call__` (they once raised AttributeError on a partial before any trial ran)."""
    import functools

    from sparkdist.tune.shared import _referenced

    bound = functools.partial(_objective_with_limit, limit=3.0)
    assert _referenced(bound) == [("argument limit= of the partial", 3.0), ("LIMIT", LIMIT)]
    data = [1, 2]
    assert _referenced(_CallableObjective(data)) == [("attribute data", data), ("LIMIT", LIMIT)]
    assert _referenced(print) == []
