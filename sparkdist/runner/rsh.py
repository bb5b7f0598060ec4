"""mpirun's rsh agent: `python -m sparkdist.runner.rsh TASK-NAME COMMAND...`.

mpirun calls it as it would call `ssh HOST COMMAND` to start its daemon on HOST.
HOST is a task name (`task-3`); the address of that task's agent and the job
secret come from the environment mpirun inherited from its Spark task
(`SPARKDIST_AGENTS`, `SPARKDIST_SECRET`), never from the command line. It relays the
daemon's output and exits with the daemon's exit code, as ssh would.
"""

from __future__ import annotations

import json
import os
import sys

from sparkdist.runner import wire
from sparkdist.runner.processes import die_with_parent


def main(argv: list[str]) -> int:
    die_with_parent()
    if len(argv) < 2:
        sys.stderr.write("usage: python -m sparkdist.runner.rsh TASK-NAME COMMAND...\n")
        return 2
    task, command = argv[0], " ".join(argv[1:])
    agents = json.loads(os.environ["SPARKDIST_AGENTS"])
    if task not in agents:
        sys.stderr.write(f"sparkdist rsh: unknown task {task!r} (known: {sorted(agents)})\n")
        return 255
    host, port = agents[task]
    secret = bytes.fromhex(os.environ["SPARKDIST_SECRET"])
    channel = wire.connect((host, int(port)), secret)
    channel.send(("orted", command))
    while True:
        message = channel.recv()
        if message[0] == "output":
            sys.stderr.write(message[1])
            sys.stderr.flush()
        elif message[0] == "exit":
            return message[1] if message[1] >= 0 else 128 - message[1]
        elif message[0] == "rejected":
            sys.stderr.write(f"sparkdist rsh: task {task} refused to start orted: {message[1]}\n")
            return 255


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
