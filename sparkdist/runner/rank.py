"""A rank: fetch the payload from the driver, prepare the environment, run `main`.

Run as `python -m sparkdist.runner.rank` by its supervisor. The result (or the
traceback) goes back to the driver over the job's authenticated channel.
"""

from __future__ import annotations

import os
import socket
import sys
import traceback

from sparkdist.runner import rank_channel
from sparkdist.runner.network import interface_of, reserve_port
from sparkdist.runner.processes import die_with_parent


def _prepare_environment(client: rank_channel.DriverClient, rank: int, host: str) -> None:
    """Set what torch.distributed's env:// rendezvous and Gloo read.

    Rank 0 reserves a free port on its own host and publishes it through the
    driver; the others wait for it. The interface for Gloo (and NCCL) is the one
    that carries the task's address, unless the user chose one.
    """
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        return
    reservation = None
    if rank == 0:
        reservation = reserve_port(host)
        client.put("master", (host, reservation.getsockname()[1]))
    master_host, master_port = client.get("master")
    os.environ["MASTER_ADDR"] = master_host
    os.environ["MASTER_PORT"] = str(master_port)
    try:
        ifname, _ = interface_of(host)
    except ValueError:
        ifname = None
    if ifname:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", ifname)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", ifname)
    if reservation is not None:
        reservation.close()


def _failure_reason(exc: BaseException) -> str:
    text = str(exc)
    return f"raised {type(exc).__name__}" + (f": {text}" if text else "")


def main() -> None:
    die_with_parent(int(os.environ["SPARKDIST_SUPERVISOR_PID"]))
    secret = bytes.fromhex(os.environ.pop("SPARKDIST_SECRET"))
    rank = int(os.environ["RANK"])
    host = os.environ.get("SPARKDIST_TASK_HOST", socket.gethostname())
    client = rank_channel.connect(os.environ["SPARKDIST_DRIVER"], secret)
    job = client.request(("rank", rank, {"host": host, "pid": os.getpid()}))

    try:
        import cloudpickle

        _prepare_environment(client, rank, host)
        fn, kwargs = cloudpickle.loads(job["payload"])
        value = fn(**kwargs)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            _report_error(rank, exc)
            sys.exit(exc.code if isinstance(exc.code, int) else 1)
        value = None
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the driver
        _report_error(rank, exc)
        sys.exit(1)

    if job["send_result"]:
        try:
            blob = cloudpickle.dumps(value)
        except Exception as exc:  # noqa: BLE001
            _report_error(rank, exc, f"returned a value that cannot be pickled: {exc}")
            sys.exit(1)
        client.request(("result", blob))
    sys.stdout.flush()
    sys.stderr.flush()


def _report_error(rank: int, exc: BaseException, reason: str | None = None) -> None:
    text = "".join(traceback.format_exception(exc))
    sys.stderr.write(text)
    sys.stderr.flush()
    rank_channel.driver_client().request(("error", text, reason or _failure_reason(exc)))


if __name__ == "__main__":
    main()
