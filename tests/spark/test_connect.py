"""Spark Connect: a real Connect server over local-cluster[2,1,1024], driven by client
processes that have no JVM (tests/connect_client.py), the way Databricks Connect or
`SparkSession.builder.remote(...)` users run sparkdist."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from helpers import free_port, pid_running

from sparkdist.spark.connect_server import LocalConnectServer

ROOT = Path(__file__).resolve().parents[2]
CLIENT = Path(__file__).parents[1] / "connect_client.py"


# The server's Spark UI, whose REST API shows what a client's jobs are called.
UI_PORT = free_port()


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory):
    log = tmp_path_factory.mktemp("connect") / "server.log"
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    ui = {"spark.ui.enabled": "true", "spark.ui.port": str(UI_PORT)}
    server = LocalConnectServer(log_path=log, env={"PYTHONPATH": pythonpath}, conf=ui)
    server.start()
    yield server.url
    server.stop()


def client_env(url: str) -> dict[str, str]:
    env = dict(os.environ, SPARK_REMOTE=url)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run_client(url: str, scenario: str, timeout: float = 300, **env: str) -> tuple[dict, str]:
    """Run one scenario in a fresh client process; its RESULT line and whole output."""
    proc = subprocess.run(
        [sys.executable, str(CLIENT), scenario],
        env={**client_env(url), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, output[-4000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["no_jvm"], "the client process started a JVM or a SparkContext"
    return result, output


def test_every_rank_value_under_both_launchers_elastic_and_warm_relayed_too(connect_url):
    result, output = run_client(connect_url, "values")
    expected = [{"rank": 0, "value": 0}, {"rank": 1, "value": 5}]
    assert result["direct"] == expected
    assert result["mpi"] == expected
    assert result["elastic"] == expected  # both slots free: the whole max_np world
    assert result["elastic_alive"] == []
    first, second = result["warm"]  # the second run in the first run's processes
    assert first == second and len(set(first)) == 2
    assert result["warm_alive"] == []  # closed
    # Relay mode: the runs carried to task 0's service, in one process, each with its
    # own arguments and its lines, and a checkpoint store of its own (the second run
    # does not resume from the first's checkpoint); closed, nothing left.
    (pid1, value1, found1), (pid2, value2, found2) = result["relay_warm"]
    assert pid1 == pid2 and (value1, value2) == (20, 30)
    assert (found1, found2) == (None, None)
    assert "[rank 0] relayed warm run with x=2" in output
    assert "[rank 0] relayed warm run with x=3" in output
    assert result["relay_warm_alive"] == []
    # Logs streamed home live, rank-prefixed, as with a classic session.
    assert "[rank 1] rank 1 of 2 says hello" in output


def test_failing_rank_traceback_reaches_the_client(connect_url):
    result, _ = run_client(connect_url, "failure")
    assert result["error"] == "RankFailedError"
    assert result["outcome"] == "failed"
    assert "rank 1" in result["message"]
    assert "Traceback from rank 1" in result["message"]
    assert "deliberate failure on rank 1 (connect test)" in result["message"]


def test_hanging_rank_ends_at_the_timeout_and_nothing_is_left(connect_url):
    result, _ = run_client(connect_url, "timeout")
    assert result["error"] == "JobTimeoutError"
    assert result["alive"] == []


def test_more_ranks_than_slots_fails_at_once_with_both_numbers(connect_url):
    result, _ = run_client(connect_url, "slots")
    assert result["error"] == "NotEnoughSlotsError"
    assert "np=3" in result["message"] and "2 task slots" in result["message"]


def test_keyboard_interrupt_cancels_the_stage_and_leaves_nothing(connect_url):
    proc = subprocess.Popen(
        [sys.executable, str(CLIENT), "interrupt"],
        env=client_env(connect_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, started = [], set()
        for line in proc.stdout:  # wait until both ranks run
            output.append(line)
            if line.endswith("] ranks started\n"):
                started.add(line.split("]")[0])
            if len(started) == 2:
                break
        assert proc.poll() is None, "".join(output)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    output.append(rest)
    lines = [line for line in "".join(output).splitlines() if line.startswith("RESULT ")]
    assert lines, "".join(output)[-4000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["outcome"] == "interrupted"
    roles = {role for _, role in result["recorded"]}
    assert {"supervisor", "rank"} <= roles or "mpirun" in roles, result["recorded"]
    assert result["alive"] == []
    assert [r["rank"] for r in result["again"]] == [0, 1]


def test_dataframe_argument_rows_read_exactly_once(connect_url):
    result, _ = run_client(connect_url, "data")
    ids = [i for shard in result["ids"] for i in shard]
    assert all(result["ids"]), "a rank read no rows"
    assert sorted(ids) == list(range(1000))
    # A Parquet scan is read in place (recognised from the client's plan), a Delta one too.
    assert sorted({i for shard in result["direct_ids"] for i in shard}) == list(range(1000))
    assert result["direct_source"] == "parquet" and result["delta_scan"] == "delta"
    assert result["cache_left"] == []  # the copy of the first job went when it ended


def test_partition_ensemble_fit_and_transform(connect_url):
    result, _ = run_client(connect_url, "ensemble")
    assert result["n_models"] == 2
    assert result["rows"] == 569
    assert result["equal"]
    assert result["accuracy"] > 0.9
    assert result["ml_rows"] == 569
    assert "Spark Connect" in result["persistence_error"]
    assert "load_model" in result["persistence_error"]
    # A plain Parquet scan is read by pyarrow from the client's plan, to the same ensemble.
    assert result["parquet_direct"] and not result["parquet_filtered_direct"]
    assert sum(result["parquet_rows"]) == 569
    assert result["parquet_same"]
    # 2 models on 2 slots: each model's task reads the file in place and keeps its rows.
    assert sum(result["parquet_in_place_rows"]) == 569
    assert min(result["parquet_in_place_rows"]) > 200
    assert result["parquet_in_place_accuracy"] > 0.9
    # Without a shuffle, each of the 2 tasks reads half of the file for its own model.
    assert sorted(result["parquet_local_rows"]) == [284, 285]
    assert result["parquet_local_accuracy"] > 0.9


def test_rank_zero_logs_into_the_clients_mlflow_run(connect_url, mlflow_server):
    result, _ = run_client(connect_url, "mlflow", MLFLOW_TRACKING_URI=mlflow_server)
    assert result["rank_run_ids"][0] == result["run_id"]
    assert result["rank_run_ids"][1] != result["run_id"]
    assert result["metrics"]["from_rank_0"] == 1.0
    assert "from_rank_1" not in result["metrics"]
    assert result["tags"]["sparkdist.np"] == "2"
    assert result["tags"]["sparkdist.outcome"] == "succeeded"


def test_report_live_into_mlflow_relayed_and_pruning_a_trial(connect_url, mlflow_server):
    result, output = run_client(connect_url, "report", MLFLOW_TRACKING_URI=mlflow_server)
    for key in ("live", "relay"):
        for rank in (0, 1):  # in order per rank (the ranks' reports interleave)
            assert [[s, v] for r, s, v in result[key] if r == rank] == [
                [s, 10.0 * s + rank] for s in range(3)
            ], result[key]
    assert result["mlflow"] == [[0, 0.0], [1, 10.0], [2, 20.0]]  # rank 0's, as step metrics
    assert result["relay_last"] == {"v": 20.0}
    assert result["trial"] == ["PRUNED", [0, 1, 2]]
    assert "sparkdist report_steps: " in output  # the progress line (plain: not a terminal)


def test_cli_runs_a_script_through_remote(connect_url, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import os, sys\n"
        "print('script rank', os.environ['RANK'], 'args', sys.argv[1:], flush=True)\n"
    )
    env = client_env(connect_url)
    env.pop("SPARK_REMOTE")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sparkdist",
            "run",
            "--remote",
            connect_url,
            "--np",
            "2",
            str(script),
            "--",
            "--epochs",
            "3",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    for rank in (0, 1):
        assert f"[rank {rank}] script rank {rank} args ['--epochs', '3']" in output
    assert "finished on 2 ranks" in output


def test_doctor_opens_a_connect_session(connect_url):
    env = client_env(connect_url)
    proc = subprocess.run(
        [sys.executable, "-m", "sparkdist", "doctor"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = next(x for x in proc.stdout.splitlines() if x.startswith("Spark Connect"))
    assert f"session at {connect_url} open (Spark " in line
    env["SPARK_REMOTE"] = "sc://127.0.0.1:1"
    proc = subprocess.run(
        [sys.executable, "-m", "sparkdist", "doctor"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "nothing accepts connections at 127.0.0.1:1" in proc.stdout


def test_tune_single_node_trials_on_connect(connect_url):
    result, _ = run_client(connect_url, "tune")
    assert result["states"] == ["PRUNED", "COMPLETE", "FAIL", "COMPLETE", "COMPLETE", "COMPLETE"]
    assert "ValueError: trial 2 fails (connect test)" in result["failure"]
    assert result["best"] == pytest.approx(0.05)
    # One Spark job (one stage) of 2 long-lived tasks ran all 6 trials.
    tasks = result["tasks"]
    assert len({stage for stage, _, _ in tasks}) == 1
    assert {part for _, part, _ in tasks} == {0, 1}
    assert result["shared_sums"] == [result["expected_sum"]] * 6
    # Classic-only things name the alternative.
    assert "JVM_ATTRIBUTE_NOT_SUPPORTED" in result["hint"]
    assert "sparkdist.tune.share" in result["hint"]
    assert "Spark Connect client object" in result["session_error"]
    assert "sparkdist.tune.share" in result["session_error"]
    assert "executors cannot open connections" in result["unreachable_error"]
    # Ctrl-C cancelled the two running trials and returned the study.
    assert result["interrupt_returned"] and result["interrupt_s"] < 120
    assert result["interrupted"] == ["COMPLETE", "FAIL", "FAIL"]
    assert "cancelled" in result["interrupt_why"]
    # The time limit: trials started within it (at most one per worker, as each runs past
    # it), none after it; the running ones finished.
    assert result["timed"] in (["COMPLETE"], ["COMPLETE", "COMPLETE"])
    assert result["timed_started_late"] == []


def test_tune_distributed_trial_on_connect(connect_url):
    pytest.importorskip("torch")
    result, _ = run_client(connect_url, "tune_np2")
    assert result["state"] == "COMPLETE"
    assert result["value"] == pytest.approx(30.0 + 2 * 0.01)
    assert result["steps"] == [0]


def test_spark_ui_names_a_runner_job_by_its_tags(connect_url):
    """A Connect client's sparkdist job carries its description (function, ranks, attempt,
    kind) and its cancel tag as Spark job tags, read back from the server's Spark UI."""
    script = textwrap.dedent(
        """
        import json
        from pyspark.sql import SparkSession
        import sparkdist

        def seven():
            return 7

        spark = SparkSession.builder.getOrCreate()
        runner = sparkdist.HorovodRunner(np=2)
        value = runner.run(seven)
        app = spark.conf.get("spark.app.id")
        print("RESULT " + json.dumps({"value": value, "job": runner.last_job.job_id, "app": app}))
        spark.stop()
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env=client_env(connect_url),
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout + proc.stderr)[-4000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["value"] == 7
    url = f"http://127.0.0.1:{UI_PORT}/api/v1/applications/{result['app']}/jobs"
    with urllib.request.urlopen(url, timeout=30) as response:
        jobs = json.load(response)
    tagged = [job for job in jobs if any(result["job"] in tag for tag in job.get("jobTags", []))]
    assert tagged, [job.get("jobTags") for job in jobs]
    tags = " ".join(tagged[0]["jobTags"])
    assert f"sparkdist-{result['job']}" in tags  # the tag that cancels it
    for part in ("seven", "2 ranks", "attempt 1", "barrier"):
        assert part in tags, tags


def test_server_dies_with_a_killed_starter(tmp_path):
    """A starter killed before `stop()` (a notebook kernel, a test process) takes its
    Connect server with it instead of leaving a JVM under init."""
    starter = textwrap.dedent(
        """
        import sys, threading
        from sparkdist.spark.connect_server import LocalConnectServer
        server = LocalConnectServer(master="local[1]").start()
        print(server.proc.pid, flush=True)
        threading.Event().wait()  # until killed
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True, env=client_env("")
    )
    try:
        server_pid = int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()
    # The server is this test's grandchild: once its parent is gone it is reparented, and
    # the parent-death signal ends it. Wait for it to disappear (never by name).
    deadline = time.monotonic() + 60
    while pid_running(server_pid):
        assert time.monotonic() < deadline, f"the Connect server {server_pid} outlived its starter"
        time.sleep(0.2)


def test_a_stall_in_relay_mode_shows_the_stacks_on_the_client(connect_url):
    """Issue 48: the job's service runs in barrier task 0; its stall warning and the
    stall's error, each with where the ranks were, come back to the client."""
    result, output = run_client(connect_url, "relay_stall", SPARKDIST_CONNECT_RELAY="always")
    assert result["error"] and result["error"].startswith("stalled: no rank showed")
    assert "ranks 0-1 (host" in result["stacks"], result
    assert "waits_in_silence (connect_client.py:" in result["stacks"], result
    assert "[sparkdist] sparkdist job" in output and "stall_warning=4" in output, output[-3000:]
    assert result["alive"] == []
    assert _left_behind(result["job_id"]) == []  # no stacks left for a client to collect
    # The job's trace (issue 63): the ranks' tracks came back from task 0 to the client's.
    trace = result["trace"]
    assert trace["problems"] == [], trace
    assert [p.split(" (")[0] for p in trace["processes"]] == ["driver", "rank 0", "rank 1"]
    assert {"1:main", "2:main", "0:attempt 1", "0:stall", "1:silent"} <= set(trace["slices"])
    assert {"1:stacks", "2:stacks", "0:stacks"} <= set(trace["instants"]), trace


def _pids(directory: Path) -> list[int]:
    """The pids the ranks of `hang_forever` noted (a file is empty while being written)."""
    texts = [p.read_text() for p in sorted(directory.glob("rank*.pid"))]
    return [int(text) for text in texts if text]


def _until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)
    return condition()


def _signalled_once_both_ranks_run(
    argv: list[str], env: dict[str, str], ranks_dir: Path, signum: int
) -> tuple[int, str, list[int]]:
    """Start `argv`, send it `signum` once both ranks noted their pids in `ranks_dir`
    (`rank<N>.pid`); its exit status, its output and the ranks' pids."""
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        started = _until(lambda: len(_pids(ranks_dir)) == 2 or proc.poll() is not None, 240)
        assert started and proc.poll() is None, proc.communicate(timeout=60)[0][-4000:]
        pids = _pids(ranks_dir)
        proc.send_signal(signum)
        output, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, output, pids


def _interrupt_relay_client(
    url: str, ranks_dir: Path, ranks_per_task: int, launcher: str = "direct"
) -> tuple[str, list, str]:
    """Run the relay_interrupt scenario, SIGINT it once both ranks run; its output, the
    ranks' pids and the job's id."""
    env = {**client_env(url), "SPARKDIST_CONNECT_RELAY": "always", "RANKS_DIR": str(ranks_dir)}
    argv = [sys.executable, str(CLIENT), "relay_interrupt"]
    env = {**env, "RANKS_PER_TASK": str(ranks_per_task), "LAUNCHER": launcher}
    _, output, pids = _signalled_once_both_ranks_run(argv, env, ranks_dir, signal.SIGINT)
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert lines, output[-4000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["outcome"] == "interrupted"
    return output, pids, result["job_id"]


def _left_behind(job_id: str) -> list[str]:
    """What of job `job_id` is in /tmp on this (every executor's) host: its supervisors'
    stacks, its tasks' directories."""
    assert job_id
    return [name for name in os.listdir(tempfile.gettempdir()) if job_id in name]


def test_an_interrupt_in_relay_mode_shows_the_stacks_then_stops_the_ranks(connect_url, tmp_path):
    """Issue 48: a Ctrl-C on a relay-mode client (whose ranks it cannot reach) cancels
    the stage; each rank's supervisor leaves its rank's stacks on its host before it
    stops the rank, and plain Spark tasks bring them to the client, which shows them
    grouped. No rank is left running, no file is left in /tmp."""
    output, pids, job_id = _interrupt_relay_client(connect_url, tmp_path, ranks_per_task=2)
    assert "Where each rank was (interrupted" in output, output[-4000:]
    assert "ranks 0-1 (host " in output and "hang_forever (connect_client.py:" in output, output
    assert _until(lambda: not any(psutil.pid_exists(pid) for pid in pids), 60), pids
    assert _left_behind(job_id) == []


@pytest.mark.parametrize("launcher", ["direct", "mpi"])
def test_an_interrupt_in_relay_mode_with_every_slot_held_shows_the_stacks(
    connect_url, tmp_path, launcher
):
    """The stage holds every slot (one task per rank, two executors): nothing can ask
    the ranks while it runs, yet the stacks they left when it was cancelled show."""
    output, pids, job_id = _interrupt_relay_client(connect_url, tmp_path, 1, launcher)
    assert "Where each rank was (interrupted" in output, output[-4000:]
    assert "ranks 0-1 (host " in output and "hang_forever (connect_client.py:" in output, output
    assert "is unknown" not in output and "left no stacks" not in output, output[-4000:]
    assert _until(lambda: not any(psutil.pid_exists(pid) for pid in pids), 60), pids
    assert _left_behind(job_id) == []


def test_sigterm_to_sparkdist_run_in_relay_mode_shows_the_stacks(connect_url, tmp_path):
    """Issue 48: SIGTERM to `sparkdist run --remote` (a scheduler, `kill`) in relay mode,
    every slot held: the stacks show, the ranks are gone, nothing is left in /tmp."""
    script = tmp_path / "train.py"
    script.write_text(
        "import os, sys, time\n"
        "def wait_here():\n"
        "    while True:\n"
        "        time.sleep(1)\n"
        "with open(os.path.join(sys.argv[1], 'rank' + os.environ['RANK'] + '.pid'), 'w') as f:\n"
        "    f.write(str(os.getpid()))\n"
        "wait_here()\n"
    )
    env = {**client_env(connect_url), "SPARKDIST_CONNECT_RELAY": "always"}
    argv = [sys.executable, "-m", "sparkdist", "run", "--np", "2", str(script), str(tmp_path)]
    returncode, output, pids = _signalled_once_both_ranks_run(argv, env, tmp_path, signal.SIGTERM)
    assert returncode != 0
    assert "Where each rank was (interrupted" in output, output[-4000:]
    assert "ranks 0-1 (host " in output and "wait_here (train.py:" in output, output[-4000:]
    assert _until(lambda: not any(psutil.pid_exists(pid) for pid in pids), 60), pids
    job_id = re.search(r"sparkdist-ranks/[0-9-]+-([0-9a-f]+)/", output)  # its rank logs
    assert job_id, output[-4000:]
    assert _left_behind(job_id[1]) == []
