"""What py-spy costs the host when a supervisor takes its rank's stacks (issue 64's peak
memory): `py-spy dump --native` reads libtorch's symbols and held 170-330 MiB beside
each rank of the relaunch soak every time a relaunched job showed where its ranks were.
py-spy now reads only a rank that gave no stacks itself (a stopped one: without pausing
it, which is the only way py-spy reads a stopped process at all), without `--native`
(about 8 MiB), unless `SPARKDIST_PY_SPY_NATIVE=1` asks for native stacks.

Real processes: a rank-like process that imported torch and answers stack requests
(`stack_dumps.listen`), and a real `StackTaker` in a fresh Python process, which reports
the largest resident size of the children it waited for (py-spy) before it reaps the
rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MEASURE = textwrap.dedent(
    """
    import json, os, resource, signal, subprocess, sys
    from sparkdist.protocol.stack_dumps import StackTaker

    stop, native = sys.argv[1] == "stop", sys.argv[2] == "native"
    env = {**os.environ, "SPARKDIST_PY_SPY": "", "SPARKDIST_PY_SPY_NATIVE": "1" if native else ""}
    taker = StackTaker(env)
    rank_env = {**env, **taker.rank_env(env), "SPARKDIST_SUPERVISOR_PID": str(os.getpid())}
    argv = [sys.executable, "-c", sys.argv[3]]
    rank = subprocess.Popen(argv, env=rank_env, stdout=subprocess.PIPE)
    assert rank.stdout.readline() == b"ready\\n"
    if stop:
        os.kill(rank.pid, signal.SIGSTOP)
        while open(f"/proc/{rank.pid}/stat").read().split()[2] != "T":  # stopped
            pass
    text, _ = taker.take(rank.pid, nccl=False)
    children_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # py-spy only
    rank.kill()
    rank.wait()
    taker.close()
    found = bool(taker.py_spy)
    print(json.dumps({"text": text, "py_spy_mib": children_kib / 1024, "found": found}))
    """
)

RANK = textwrap.dedent(
    """
    import os, time
    import torch  # its libraries hold the symbols a native dump reads
    from sparkdist.protocol import stack_dumps
    stack_dumps.listen(os.environ, 0)

    def waits_for_its_peers():
        print("ready", flush=True)
        time.sleep(600)

    waits_for_its_peers()
    """
)


def measure(stop: bool, native: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT}
    argv = [sys.executable, "-c", MEASURE, "stop" if stop else "run", "native" if native else "-"]
    done = subprocess.run([*argv, RANK], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    if not out["found"]:
        pytest.skip("py-spy is not installed (requirements/lock.txt)")
    return out


def test_a_rank_that_answers_itself_gets_no_py_spy():
    out = measure(stop=False, native=False)
    assert "in waits_for_its_peers" in out["text"], out["text"]  # faulthandler's answer
    assert "py-spy" not in out["text"], out["text"]
    assert out["py_spy_mib"] == 0, out  # no py-spy ran (it held 100 MiB or more with --native)


def test_a_stopped_rank_is_read_by_py_spy_in_a_few_mib():
    out = measure(stop=True, native=False)
    text = out["text"]
    assert "stacks read by py-spy (py-spy dump --nonblocking --pid " in text, text
    assert "waits_for_its_peers (<string>:" in text, text
    assert "libpython" not in text and "--native" not in text, text
    assert 0 < out["py_spy_mib"] < 40, out  # --native: 100 MiB or more


def test_native_stacks_when_asked():
    out = measure(stop=False, native=True)
    text = out["text"]
    assert "in waits_for_its_peers" in text and "native stacks (py-spy dump --native --pid " in text
    print(f"py-spy --native held {out['py_spy_mib']:.0f} MiB")
