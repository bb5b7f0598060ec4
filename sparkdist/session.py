"""An embedded Spark for demos, notebooks and tests: real executors on this machine.

`local-cluster[N,1,1024]` starts N executor JVMs (each with its own Python workers),
so barrier stages behave as on a multi-host cluster. Everything binds to 127.0.0.1.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping


def embedded_spark(
    executors: int = 2,
    app_name: str = "sparkdist",
    *,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
):
    """Get the active SparkSession, or start one: `master`, else a local-cluster with
    `executors` executors, quiet and on 127.0.0.1; `conf` adds Spark settings."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master or f"local-cluster[{executors},1,1024]")
        .appName(app_name)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executor.memory", "1g")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
