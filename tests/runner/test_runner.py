"""The runner end to end: real Spark (local-cluster, two executors), real mpirun,
real torch.distributed over Gloo."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import pytest
from helpers import assert_nothing_left, interrupt_once_ranks_ran

from sparkdist import (
    HorovodRunner,
    JobFailedError,
    JobTimeoutError,
    NotEnoughSlotsError,
    PayloadError,
    RankFailedError,
)

LAUNCHERS = ["mpi", "direct"]
PLACEMENTS = [2, -2]


def allreduce_main(scale):
    """init the process group with no arguments, one allreduce, return a float."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    rank, size = dist.get_rank(), dist.get_world_size()
    dist.destroy_process_group()
    return {"rank": rank, "size": size, "sum": value.item() * scale}


def job_roles(np: int, launcher: str) -> set[str]:
    roles = {"supervisor", "rank"}
    if launcher == "mpi":
        roles.add("mpirun")
        if np > 0:
            roles.add("orted")
    return roles


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("np_", PLACEMENTS)
def test_allreduce_all_results(sc, np_, launcher):
    runner = HorovodRunner(np=np_, launcher=launcher, start_timeout=120, timeout=300)
    results = runner.run_all(allreduce_main, scale=2.0)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["size"] == 2 and r["sum"] == 6.0 for r in results)
    assert runner.last_job.outcome == "succeeded"
    assert_nothing_left(runner, job_roles(np_, launcher))


def test_run_returns_rank_zero_value(sc):
    def main(offset):
        import os

        return int(os.environ["RANK"]) + offset

    assert HorovodRunner(np=2).run(main, offset=100) == 100
    assert HorovodRunner(np=-2).run(main, offset=7) == 7


def test_rank_environment_and_process_tree(sc):
    """Ranks see the standard variables, are children of orted started by a Spark
    task, and no process of the job has the secret on its command line."""

    def main():
        import os

        import psutil

        secret = None
        with open("/proc/self/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"SPARKDIST_SECRET="):
                    secret = item.split(b"=", 1)[1].decode()
        chain = []
        proc = psutil.Process()
        while proc is not None and len(chain) < 6:
            chain.append(" ".join(proc.cmdline()))
            proc = proc.parent()
        names = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK"]
        names += ["MASTER_ADDR", "MASTER_PORT"]
        return {
            "env": {k: os.environ.get(k) for k in names},
            "secret_in_env_now": "SPARKDIST_SECRET" in os.environ,
            "secret_on_cmdline": any(secret and secret in c for c in chain),
            "secret_seen": secret is not None,
            "chain": chain,
        }

    runner = HorovodRunner(np=2, launcher="mpi")
    results = runner.run_all(main)
    for rank, result in enumerate(results):
        env = result["env"]
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "2"
        assert env["LOCAL_RANK"] == "0" and env["LOCAL_WORLD_SIZE"] == "1"
        assert env["NODE_RANK"] == str(rank)
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
        assert result["secret_seen"] and not result["secret_on_cmdline"]
        assert not result["secret_in_env_now"]
        chain = result["chain"]
        assert "sparkdist.runner.rank.main" in chain[0]
        assert "sparkdist.runner.rank.supervisor" in chain[1]
        assert os.path.basename(chain[2].split()[0]) == "orted"
        assert "pyspark" in " ".join(chain[3:]) or "daemon" in " ".join(chain[3:])
    # All hosts' MASTER_PORT agree.
    assert len({r["env"]["MASTER_PORT"] for r in results}) == 1


def session_chain_main():
    """Session and process group of this rank and of its ancestors, up to the process
    that started the job (the driver, or the Spark task's Python worker)."""
    import os

    import psutil

    chain = []
    proc = psutil.Process()
    while proc is not None and len(chain) < 8:
        cmdline = " ".join(proc.cmdline())
        chain.append({"pid": proc.pid, "sid": os.getsid(proc.pid), "pgid": os.getpgid(proc.pid)})
        if "pyspark.daemon" in cmdline or proc.pid == int(os.environ["DRIVER_PID"]):
            return chain
        proc = proc.parent()
    raise AssertionError(f"no Spark worker or driver among the rank's ancestors: {chain}")


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("np_", PLACEMENTS)
def test_ranks_get_their_launchers_sessions(sc, np_, launcher):
    """Every process of a job is in a process group of its own (so it can be stopped
    with all it started), and ranks are in the sessions their framework's own launcher
    would give them, since Linux's autogroup scheduler shares the CPU per session:
    under mpirun the session of whoever started the job (Horovod's MPI controller
    slowed 4-17x in some jobs when its ranks had sessions of their own); under the
    direct launcher one session per rank, as torchrun and horovodrun --gloo do."""
    runner = HorovodRunner(np=np_, launcher=launcher, env={"DRIVER_PID": str(os.getpid())})
    for chain in runner.run_all(session_chain_main):
        rank, launchers = chain[0], chain[1:]
        assert rank["pgid"] == rank["pid"], chain
        assert {p["sid"] for p in launchers} == {chain[-1]["sid"]}, chain
        if launcher == "mpi":
            assert rank["sid"] == chain[-1]["sid"], chain
        else:
            assert rank["sid"] == rank["pid"], chain
        if np_ < 0:
            assert chain[-1]["pid"] == os.getpid() and chain[-1]["sid"] == os.getsid(0)


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("np_", PLACEMENTS)
def test_exception_on_rank_one_reaches_driver(sc, np_, launcher):
    def main():
        import os
        import time

        if os.environ["RANK"] == "1":
            print("about to fail", flush=True)
            raise ValueError("boom from rank one")
        time.sleep(600)  # rank 0 would hang forever: the job must be stopped

    runner = HorovodRunner(np=np_, launcher=launcher, start_timeout=120, timeout=300)
    started = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        runner.run(main)
    elapsed = time.monotonic() - started
    error = info.value
    assert error.rank == 1 and error.exit_code == 1
    assert error.host == "127.0.0.1"
    assert "ValueError: boom from rank one" in error.traceback
    assert 'raise ValueError("boom from rank one")' in str(error)
    assert "about to fail" in error.output_tail
    assert elapsed < 60, f"the failure took {elapsed:.0f}s to reach the driver"
    assert runner.last_job.outcome == "failed"
    assert_nothing_left(runner, job_roles(np_, launcher))


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_rank_killed_by_sigkill(sc, launcher):
    def main():
        import os
        import signal
        import time

        if os.environ["RANK"] == "1":
            print("killing myself", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(600)

    runner = HorovodRunner(np=2, launcher=launcher, timeout=300)
    with pytest.raises(RankFailedError) as info:
        runner.run(main)
    error = info.value
    assert error.rank == 1
    assert error.exit_code == -signal.SIGKILL and error.signal == "SIGKILL"
    assert "signal SIGKILL (9)" in str(error)
    assert "killing myself" in error.output_tail
    assert_nothing_left(runner, job_roles(2, launcher))
    # The cluster is usable for the next job.
    assert HorovodRunner(np=2, launcher=launcher).run(allreduce_main, scale=1.0)["sum"] == 3.0


@pytest.mark.parametrize("np_", PLACEMENTS)
def test_hanging_rank_stopped_by_timeout(sc, np_):
    def main():
        import os
        import time

        if os.environ["RANK"] == "1":
            print("hanging now", flush=True)
            time.sleep(600)
        return "rank 0 done"

    runner = HorovodRunner(np=np_, timeout=20)
    with pytest.raises(JobTimeoutError) as info:
        runner.run(main)
    assert "ranks [1]" in str(info.value)
    assert "hanging now" in str(info.value)
    assert_nothing_left(runner, job_roles(np_, runner.last_job.launcher))


def test_start_timeout_when_ranks_cannot_start(tmp_path, sc):
    # Every Python the job starts runs this sitecustomize first, and never gets further.
    (tmp_path / "sitecustomize.py").write_text("import time\ntime.sleep(600)\n")
    runner = HorovodRunner(
        np=-2, launcher="direct", start_timeout=8, env={"PYTHONPATH": str(tmp_path)}
    )
    with pytest.raises(JobTimeoutError) as info:
        runner.run(allreduce_main, scale=1.0)
    assert "start timeout" in str(info.value) and "[0, 1]" in str(info.value)
    assert_nothing_left(runner, {"supervisor"})


def test_keyboard_interrupt_stops_everything(tmp_path, sc):
    marker = tmp_path / "started"

    def main(path):
        import pathlib
        import time

        pathlib.Path(f"{path}.{__import__('os').environ['RANK']}").touch()
        time.sleep(600)

    runner = HorovodRunner(np=2)
    watcher = interrupt_once_ranks_ran(marker, 2)
    with pytest.raises(KeyboardInterrupt):
        runner.run(main, path=str(marker))
    watcher.join()
    assert runner.last_job.outcome == "interrupted"
    assert_nothing_left(runner, job_roles(2, "mpi"))


def test_np_larger_than_slots_fails_early(sc):
    started = time.monotonic()
    with pytest.raises(NotEnoughSlotsError) as info:
        HorovodRunner(np=3).run(allreduce_main, scale=1.0)
    assert "np=3" in str(info.value) and "has 2 task slots" in str(info.value)
    assert time.monotonic() - started < 10


def test_unpicklable_closure_is_named():
    lock = threading.Lock()

    def main():
        with lock:
            return 1

    with pytest.raises(PayloadError) as info:
        HorovodRunner(np=-2).run(main)
    message = str(info.value)
    assert "'lock'" in message and "_thread.lock" in message
    assert "inside the function" in message


def test_unpicklable_spark_context_argument(sc):
    def main(context):
        return context.version

    with pytest.raises(PayloadError) as info:
        HorovodRunner(np=2).run(main, context=sc)
    assert "keyword argument 'context'" in str(info.value)
    assert "SparkContext" in str(info.value)


@pytest.mark.parametrize("bad", [0, 1.5, True, "2"])
def test_invalid_np(bad):
    with pytest.raises(ValueError, match="np"):
        HorovodRunner(np=bad)


def test_invalid_options():
    with pytest.raises(ValueError, match="driver_log_verbosity"):
        HorovodRunner(np=2, driver_log_verbosity="some")
    with pytest.raises(ValueError, match="launcher"):
        HorovodRunner(np=2, launcher="ssh")
    with pytest.raises(ValueError, match="timeout"):
        HorovodRunner(np=2, timeout=-1)
    with pytest.raises(ValueError, match="env"):
        HorovodRunner(np=2, env={"A": 1})
    with pytest.raises(ValueError, match="mpi_args"):
        HorovodRunner(np=2, mpi_args="--mca btl tcp")
    with pytest.raises(ValueError, match="ranks_per_task must be an int >= 1"):
        HorovodRunner(np=2, ranks_per_task=0)
    with pytest.raises(ValueError, match="np=3 must be a multiple of ranks_per_task=2"):
        HorovodRunner(np=3, ranks_per_task=2)
    with pytest.raises(ValueError, match="use np > 0"):
        HorovodRunner(np=-2, ranks_per_task=2)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_logs_stream_with_rank_prefix_in_order(sc, capfd, launcher):
    def main():
        import os
        import sys

        rank = os.environ["RANK"]
        for i in range(50):
            print(f"line {i} from {rank}")
        print(f"to stderr from {rank}", file=sys.stderr)
        return rank

    HorovodRunner(np=2, launcher=launcher).run(main)
    out, err = capfd.readouterr()
    for rank in (0, 1):
        seen = [int(m) for m in re.findall(rf"^\[rank {rank}\] line (\d+) from {rank}$", out, re.M)]
        assert seen == list(range(50))
        assert f"[rank {rank}] to stderr from {rank}" in err


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_ranks_reach_the_driver_through_their_tasks_relay(sc, capfd, launcher):
    """Two tasks of four ranks: the driver held one connection per task and sent the
    payload once per task; every rank's result and output arrived through the relays."""
    ballast = os.urandom(1 << 20)  # travels in the payload

    def main():
        import os

        rank = int(os.environ["RANK"])
        print(f"through the relay from rank {rank}")
        return rank, len(ballast)

    runner = HorovodRunner(np=8, ranks_per_task=4, launcher=launcher)
    assert runner.run_all(main) == [(rank, len(ballast)) for rank in range(8)]
    out, _ = capfd.readouterr()
    for rank in range(8):
        assert f"[rank {rank}] through the relay from rank {rank}" in out
    job = runner.last_job
    assert job.driver_connections_max == 2
    assert job.payload_bytes > len(ballast)
    assert job.payload_bytes_sent == 2 * job.payload_bytes
    assert_nothing_left(runner, job_roles(8, launcher))


def test_log_callback_only(sc, capfd):
    def main():
        import os

        import sparkdist

        print("this stays on the rank")
        sparkdist.log_to_driver(f"progress from {os.environ['RANK']}")

    HorovodRunner(np=2, driver_log_verbosity="log_callback_only").run(main)
    out, _ = capfd.readouterr()
    assert "[rank 0] progress from 0" in out and "[rank 1] progress from 1" in out
    assert "this stays on the rank" not in out


def test_user_env_and_mpi_args_reach_ranks(sc):
    def main():
        import os

        return os.environ.get("MY_SETTING"), os.environ.get("OMPI_MCA_test_marker")

    runner = HorovodRunner(
        np=2, env={"MY_SETTING": "42"}, mpi_args=["-x", "OMPI_MCA_test_marker=yes"]
    )
    assert runner.run_all(main) == [("42", "yes"), ("42", "yes")]


def test_network_interface_named_by_user(sc):
    assert HorovodRunner(np=2, network_interface="lo").run(allreduce_main, scale=1.0)["sum"] == 3.0


def test_unknown_network_interface_fails_fast_with_reason(sc):
    started = time.monotonic()
    with pytest.raises(JobFailedError) as info:
        HorovodRunner(np=2, network_interface="nope0").run(allreduce_main, scale=1.0)
    assert "network interface 'nope0' does not exist" in str(info.value)
    assert "Py4J" not in str(info.value) and "at org.apache" not in str(info.value)
    assert time.monotonic() - started < 120
    # The cluster is usable for the next job.
    assert HorovodRunner(np=2).run(allreduce_main, scale=1.0)["sum"] == 3.0
