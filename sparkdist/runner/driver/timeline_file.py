"""Horovod timeline, the driver's side: where the job's timeline was asked for, and
writing the file rank 0 sent there (see `backends/timeline.py` for the rank's side).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from sparkdist.backends.timeline import DYNAMIC, FILE_NAME

logger = logging.getLogger(__name__)


def requested_path(option: str | None, environ: Mapping[str, str]) -> str | None:
    """The driver-side path asked for: the runner option, else HOROVOD_TIMELINE."""
    path = option if option is not None else environ.get("HOROVOD_TIMELINE")
    return path or None


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
