"""mpirun's rsh agent: `python -m sparkdist.runner.task.rsh TASK-NAME COMMAND...`.

mpirun calls it as it would call `ssh HOST COMMAND` to start its daemon on HOST.
HOST is a task name (`task-3`); the address of that task's agent and the job
secret come from the environment mpirun inherited from its Spark task
(`job_environment.AGENTS`, `SECRET`), never from the command line. It relays the
daemon's output and exits with the daemon's exit code, as ssh would.
"""

from __future__ import annotations

import os
import sys

from sparkdist import job_environment
from sparkdist.errors import exit_status
from sparkdist.protocol import messages, wire
from sparkdist.protocol.job_secret import JobSecret
from sparkdist.protocol.processes import die_with_parent


def main(argv: list[str]) -> int:
    die_with_parent()
    if len(argv) < 2:
        sys.stderr.write("usage: python -m sparkdist.runner.task.rsh TASK-NAME COMMAND...\n")
        return 2
    task, command = argv[0], " ".join(argv[1:])
    agents = job_environment.agents_from_env(os.environ)
    if task not in agents:
        sys.stderr.write(f"sparkdist rsh: unknown task {task!r} (known: {sorted(agents)})\n")
        return 255
    secret = JobSecret.from_text(job_environment.take_secret(os.environ))
    channel = wire.connect(agents[task], secret)
    channel.send(messages.encode(messages.OrtedLaunch(command)))
    while True:
        reply = messages.decode(channel.recv(), messages.AGENT_REPLIES)
        if isinstance(reply, messages.OrtedOutput):
            sys.stderr.write(reply.text)
            sys.stderr.flush()
        elif isinstance(reply, messages.OrtedExit):
            return exit_status(reply.exit_code)
        else:
            sys.stderr.write(f"sparkdist rsh: task {task} refused to start orted: {reply.reason}\n")
            return 255


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
