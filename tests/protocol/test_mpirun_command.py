"""mpirun's command line for a job on the cluster (`protocol/launch.mpirun_argv`), run by
the real mpirun with a stand-in for the rsh agent: no Spark, no daemon starts.

The hosts mpirun sees are task names (`task-3`), not DNS names. Unless told not to,
mpirun looks every one up before it starts any daemon, and a resolver that drops part of
a burst of queries costs a 5 s timeout each: 15 s of a 32-task job's start here."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from sparkdist.protocol.launch import mpirun_argv


def test_mpirun_asks_for_daemons_by_task_name_and_resolves_no_names(tmp_path):
    calls = tmp_path / "calls"
    # Stands in for the rsh agent (`python -S -I .../rsh.py`): it notes how it was called
    # and fails, so mpirun gives up without starting anything.
    stand_in = tmp_path / "rsh"
    stand_in.write_text(f'#!/bin/sh\necho "$@" >> {shlex.quote(str(calls))}\nexit 1\n')
    stand_in.chmod(0o755)
    hosts = [(f"task-{i}", 1) for i in range(4)]
    argv = mpirun_argv(sys.executable, 4, hosts, ["127.0.0.0/8"], [], rsh_agent=str(stand_in))
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    done = subprocess.run(
        argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    lines = calls.read_text().splitlines()
    assert lines, done.stdout + done.stderr
    for line in lines:
        host, *command = line.split()
        assert host in {name for name, _ in hosts}
        assert os.path.basename(command[0]) == "orted"
        # mpirun itself and every daemon it starts: no look-ups of the task names.
        assert "if_base_do_not_resolve" in command
    assert "if_base_do_not_resolve" in argv
