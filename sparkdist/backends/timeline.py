"""Horovod timeline: rank 0 records it, the driver gets the file where it asked for it.

Why: Databricks documents `os.environ["HOROVOD_TIMELINE"] = path` on the driver before
`HorovodRunner(...).run(...)`. Horovod writes the timeline in rank 0's process, which
may run on another host, where that path means nothing. So the runner passes the
driver's path to the ranks (`SPARKDIST_HOROVOD_TIMELINE`, from `HorovodRunner(timeline=)`
or the driver's HOROVOD_TIMELINE); rank 0 lets Horovod write to a local temporary file,
and when the rank exits (after Horovod's own shutdown has flushed the file) sends it
to the driver over the job's authenticated channel, which writes it at the path. The
other ranks get HOROVOD_TIMELINE too, as under `horovodrun`, but Horovod writes only on
rank 0.

Horovod leaves the file as an unterminated JSON array (Chrome's trace viewer accepts
that); it is closed here so that the file is valid JSON for every other tool as well.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping

from sparkdist.backends.base import RankContext

logger = logging.getLogger(__name__)

TIMELINE_ENV = "SPARKDIST_HOROVOD_TIMELINE"
FILE_NAME = "horovod_timeline"
DYNAMIC = "DYNAMIC"  # Horovod's "start it later with hvd.start_timeline()"


def requested_path(option: str | None, environ: Mapping[str, str]) -> str | None:
    """The driver-side path asked for: the runner option, else HOROVOD_TIMELINE."""
    path = option if option is not None else environ.get("HOROVOD_TIMELINE")
    return path or None


def close_json_array(data: bytes) -> bytes:
    """Horovod's timeline (`[` then `{...},` per event) as a complete JSON array."""
    body = data.rstrip()
    if not body or body.endswith(b"]"):
        return data
    if body.endswith(b","):
        body = body[:-1]
    return body + b"\n]\n"


def save_timeline(files: Mapping[str, bytes], path: str | None) -> str | None:
    """On the driver: write the timeline rank 0 sent (if any) at `path`."""
    if not path or path == DYNAMIC or FILE_NAME not in files:
        return None
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    partial = f"{path}.partial"
    with open(partial, "wb") as f:
        f.write(files[FILE_NAME])
    os.replace(partial, path)
    logger.info("Horovod timeline written to %s", path)
    return path


def _send_timeline(local_path: str) -> None:
    """At rank 0's exit: send the timeline file to the driver, then remove it."""
    from sparkdist.runner.rank_channel import driver_client

    try:
        with open(local_path, "rb") as f:
            data = f.read()
        client = driver_client()
        if data and client is not None:
            client.request(("file", FILE_NAME, close_json_array(data)))
    except FileNotFoundError:
        pass  # Horovod was never initialised
    except Exception:  # noqa: BLE001 - never turn a finished rank into a failed one
        logger.warning("could not send the Horovod timeline to the driver", exc_info=True)
    finally:
        shutil.rmtree(os.path.dirname(local_path), ignore_errors=True)


class TimelineBackend:
    name = "horovod-timeline"

    def prepare(self, ctx: RankContext) -> None:
        target = ctx.env.get(TIMELINE_ENV)
        if not target:
            return
        if target == DYNAMIC or ctx.rank != 0:
            ctx.env["HOROVOD_TIMELINE"] = target
            return
        local_path = os.path.join(tempfile.mkdtemp(prefix="sparkdist-timeline-"), "timeline.json")
        ctx.env["HOROVOD_TIMELINE"] = local_path
        # Registered before the user's code runs, so it runs after Horovod's own atexit
        # shutdown (atexit is last in, first out), when the file is complete.
        atexit.register(_send_timeline, local_path)
