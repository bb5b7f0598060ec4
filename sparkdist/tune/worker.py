"""A single-node worker: one long-lived Spark task that asks the driver's trial service
for a trial, runs the objective, reports the outcome and asks again, until the driver
says the search starts no more trials. Runs in the Spark task (executor side)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

from sparkdist.protocol import messages, payload, wire
from sparkdist.tune import shared
from sparkdist.tune.messages import AskTrial, NoMoreTrials, RunTrial, TrialDone, WatchWorker
from sparkdist.tune.outcome import run_objective
from sparkdist.tune.remote_trial import RemoteTrial


def run_worker(
    index: int, blob: bytes, address: tuple[str, int], secret: wire.JobSecret, import_path: str
) -> bytes:
    """Run trials until told to stop; return a JSON summary (worker, pid, trials run)."""
    # The driver's modules become importable first: an objective defined in a module is
    # pickled by reference, as the runner's ranks see it.
    for entry in import_path.split(os.pathsep):
        if entry and entry not in sys.path and os.path.isdir(entry):
            sys.path.append(entry)
    objective, _ = payload.unpack(blob)
    shared.serve_from(address, secret)
    channel = wire.connect(address, secret)
    done = threading.Event()
    watch = _watch_driver(index, address, secret, done)
    ran = []
    try:
        while True:
            raw = channel.request(messages.encode(AskTrial(index, os.getpid())))
            order = messages.reply_to(raw, (RunTrial, NoMoreTrials))
            if isinstance(order, NoMoreTrials):
                break
            trial = RemoteTrial(address, secret, order.number, order.params)
            outcome = run_objective(objective, trial)
            raw = channel.request(messages.encode(TrialDone(order.number, outcome)))
            messages.reply_to(raw, (messages.Ok,))
            ran.append(order.number)
    finally:
        done.set()
        watch.close()
        channel.close()
    return json.dumps({"worker": index, "pid": os.getpid(), "trials": ran}).encode()


def _watch_driver(
    index: int, address: tuple[str, int], secret: wire.JobSecret, done: threading.Event
):
    """Kill this process when the driver closes the watch channel (the search was
    cancelled) or goes away, unless the worker is done: an objective left running would
    hold its task slot, whatever Spark's task kill does to a busy Python worker."""
    watch = wire.connect(address, secret)
    watch.send(messages.encode(WatchWorker(index)))

    def wait_for_end() -> None:
        try:
            watch.recv()
        except Exception:  # noqa: BLE001 - the channel's end is the signal
            pass
        if not done.is_set():
            os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait_for_end, name="sparkdist-tune-watch", daemon=True).start()
    return watch
