"""Horovod timeline, the rank's side: rank 0 records it and sends it to the driver,
which writes it where it was asked for (`runner/driver/job.py`). Horovod leaves
the file as an unterminated JSON array (Chrome's trace viewer accepts that); it is
closed before sending, so that the file is valid JSON for every other tool as well.

Why: Databricks documents `os.environ["HOROVOD_TIMELINE"] = path` on the driver before
`HorovodRunner(...).run(...)`. Horovod writes the timeline in rank 0's process, which
may run on another host, where that path means nothing. So the runner passes the
driver's path to the ranks (`job_environment.HOROVOD_TIMELINE`, from `HorovodRunner(timeline=)`
or the driver's HOROVOD_TIMELINE); rank 0 lets Horovod write to a local temporary file,
and when the rank exits (after Horovod's own shutdown has flushed the file) sends it
to the driver over the job's authenticated channel, which writes it at the path. The
other ranks get HOROVOD_TIMELINE too, as under `horovodrun`, but Horovod writes only on
rank 0.

"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile

from sparkdist import job_environment
from sparkdist.backends.base import RankContext, Rendezvous

logger = logging.getLogger(__name__)

FILE_NAME = "horovod_timeline"
DYNAMIC = "DYNAMIC"  # Horovod's "start it later with hvd.start_timeline()"


def close_json_array(data: bytes) -> bytes:
    """Horovod's timeline (`[` then `{...},` per event) as a complete JSON array."""
    body = data.rstrip()
    if not body or body.endswith(b"]"):
        return data
    if body.endswith(b","):
        body = body[:-1]
    return body + b"\n]\n"


def _send_timeline(driver: Rendezvous, local_path: str) -> None:
    """At rank 0's exit: send the timeline file to the driver, then remove it."""
    try:
        with open(local_path, "rb") as f:
            data = f.read()
        if data:
            driver.send_file(FILE_NAME, close_json_array(data))
    except FileNotFoundError:
        pass  # Horovod was never initialised
    except Exception:  # noqa: BLE001 - never turn a finished rank into a failed one
        logger.warning("could not send the Horovod timeline to the driver", exc_info=True)
    finally:
        shutil.rmtree(os.path.dirname(local_path), ignore_errors=True)


def finish() -> None:
    """Once `main` returned on rank 0: let Horovod write every timeline event it still
    holds. Its shutdown (at exit) stops the timeline's writer thread at once and drops
    what is queued, so the last collectives could be missing from the file (seen: the
    last of 5 allreduces, under load); `stop_timeline` returns only once the queue is
    written and the file closed."""
    if os.environ.get(job_environment.HOROVOD_TIMELINE) in (None, "", DYNAMIC):
        return
    for name in ("horovod.torch", "horovod.tensorflow", "horovod.keras"):
        hvd = sys.modules.get(name)
        if hvd is not None and hvd.is_initialized() and hvd.rank() == 0:  # who records it
            try:
                hvd.stop_timeline()
            except Exception:  # noqa: BLE001 - a timeline never fails a finished rank
                logger.warning("could not stop the Horovod timeline", exc_info=True)
            return


class TimelineBackend:
    name = "horovod-timeline"

    def prepare(self, ctx: RankContext) -> None:
        target = ctx.env.get(job_environment.HOROVOD_TIMELINE)
        if not target:
            return
        if target == DYNAMIC or ctx.rank != 0:
            ctx.env["HOROVOD_TIMELINE"] = target
            return
        local_path = os.path.join(tempfile.mkdtemp(prefix="sparkdist-timeline-"), "timeline.json")
        ctx.env["HOROVOD_TIMELINE"] = local_path
        # Registered before the user's code runs, so it runs after Horovod's own atexit
        # shutdown (atexit is last in, first out), when the file is complete.
        atexit.register(_send_timeline, ctx.rendezvous, local_path)
