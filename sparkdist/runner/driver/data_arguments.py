"""Spark DataFrame arguments of a job: converted for the ranks, their copies removed after.

`run(main, train=df)` hands `main` a converter (`sparkdist.data`) instead of the
DataFrame: each rank reads its own rows from Parquet, nothing goes into the payload. A
DataFrame that is a plain Parquet or Delta scan is read in place; any other is copied
once, and that copy is removed when the job ends, whether it succeeded, failed or was
interrupted. A copy the job did not write (the user's own converter of the same
DataFrame, reused) is left alone.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger(__name__)


@contextmanager
def converted_dataframes(kwargs: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """`kwargs` with every Spark DataFrame replaced by a converter, for the job's length."""
    if "pyspark" not in sys.modules:
        yield kwargs
        return
    from pyspark.sql import DataFrame

    frames = [key for key, value in kwargs.items() if isinstance(value, DataFrame)]
    if not frames:
        yield kwargs
        return
    from sparkdist.data.conversion import convert

    converted = dict(kwargs)
    written = []
    try:
        for key in frames:
            conversion = convert(kwargs[key])
            converted[key] = conversion.converter
            if conversion.wrote_copy:
                written.append(conversion.converter)
            logger.info("DataFrame argument %r arrives in the ranks as a converter handle", key)
        yield converted
    finally:
        for converter in written:
            try:
                converter.delete()
            except Exception as error:  # the job's own outcome is what to report
                logger.warning(
                    "could not remove the copy at %s: %r", converter.cache_dir_url, error
                )
