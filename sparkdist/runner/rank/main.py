"""A rank: fetch the payload from the driver, prepare the environment, run `main`.

Run as `python -m sparkdist.runner.rank.main` by its supervisor. The result (or the
traceback) goes back to the driver over the job's authenticated channel.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback

from sparkdist import checkpoint, job_environment, roles, tracking
from sparkdist.backends import (
    frameworks_in_use,
    prepare_rank,
    rank_context,
    tensorflow,
    timeline,
)
from sparkdist.job_environment import TaskEnvironment
from sparkdist.protocol import driver_channel, messages, payload, rank_trace, stack_dumps
from sparkdist.protocol.job_secret import JobSecret
from sparkdist.protocol.processes import die_with_parent
from sparkdist.runner.rank import warm


def _failure_reason(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r})"
    text = str(exc)
    return f"raised {type(exc).__name__}" + (f": {text}" if text else "")


def main() -> None:
    die_with_parent(int(os.environ[job_environment.SUPERVISOR_PID]))
    secret = JobSecret.from_text(job_environment.take_secret(os.environ))
    place = TaskEnvironment.from_env(os.environ, secret, socket.gethostname())
    rank = int(os.environ["RANK"])
    stack_dumps.listen(os.environ, rank)  # the driver may ask where this rank is
    client = driver_channel.connect(place.job.driver, secret)
    asked_at = time.monotonic()
    job = client.request(messages.RankHello(rank, place.task_host, os.getpid()))
    rank_trace.start(job.clock_us, asked_at, time.monotonic())
    os.environ.update(job.env)  # rank 0's tracking credentials; nothing for the others
    warm.remember_start(os.environ, place)  # a warm world's runs each start from here

    try:
        import cloudpickle

        prepare_rank(rank_context(client, place, os.environ))
        role = roles.rank_role(os.environ)
        if role is not None and role[0] in roles.SERVERS:
            tensorflow.serve(*role)  # until the driver stops it: the chief is done
        tracking.setup_rank()
        fn, kwargs = payload.unpack(job.payload)
        if rank_trace.recording():
            rank_trace.main_entered()
            driver_channel.send_alive(wait=True)  # the launch's end, even for a silent rank
        value = fn(**kwargs)
        checkpoint.wait()  # an async save still in flight is written and committed
        timeline.finish()  # Horovod's shutdown at exit would drop its last events
    except checkpoint.Resize:
        _exit_now(0)  # an elastic job grows: the driver relaunches it from the checkpoint
    except SystemExit as exc:
        if exc.code not in (None, 0):
            _report_error(rank, exc)
            _exit_now(exc.code if isinstance(exc.code, int) else 1)
        value = None
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the driver
        _report_error(rank, exc)
        _exit_now(1)

    if job.send_result:
        try:
            blob = cloudpickle.dumps(value)
        except Exception as exc:  # noqa: BLE001
            _report_error(rank, exc, f"returned a value that cannot be pickled: {exc}")
            _exit_now(1)
        driver_channel.send_alive(wait=True)  # the trace's last events, before the result
        client.request(messages.Result(blob, frameworks_in_use()))
    else:
        driver_channel.send_alive(wait=True)
    _exit_now(0)


def _exit_now(code: int) -> None:
    """Exit without the interpreter's slow module teardown (seconds with torch or
    TensorFlow loaded); atexit handlers, such as MLflow's flush, still run."""
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _report_error(rank: int, exc: BaseException, reason: str | None = None) -> None:
    text = "".join(traceback.format_exception(exc))
    sys.stderr.write(text)
    sys.stderr.flush()
    driver_channel.send_alive(wait=True)
    driver_channel.driver_client().request(messages.RankError(text, reason or _failure_reason(exc)))


if __name__ == "__main__":
    main()
