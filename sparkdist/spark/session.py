"""An embedded Spark for demos, notebooks and tests: real executors on this machine.

`local-cluster[N,1,1024]` starts N executor JVMs (each with its own Python workers),
so barrier stages behave as on a multi-host cluster. Everything binds to 127.0.0.1.

Quiet start: the driver JVM logs with the project's `conf/log4j2.properties`
(warnings and errors, none of the known harmless ones) unless the user configured
log4j2 themselves.

Clean stop: a session started here is stopped before the interpreter exits. Left to
the JVM's own shutdown, local-cluster floods the console with errors: when Python
exits the driver JVM sees its stdin close and calls `System.exit`; Spark's shutdown
hooks then run by priority, the workers' ExecutorRunner hooks (priority 100) before
the SparkContext's (50). Those kill the executors as FAILED ("Worker shutting
down") while the application is still registered, so the in-process Master asks the
workers for replacements, each of which fails to register its own shutdown hook
("Failed to launch executor ... Shutdown hooks cannot be modified during shutdown")
until the Master gives up and removes the application ("Master removed our
application: FAILED"). `SparkContext.stop()` first unregisters the application, so
its executors end as KILLED and are not replaced, and only then stops the local
cluster: nothing to report. It waits first (a few seconds at most) until the
executors have reported every task they were running: a job that just failed leaves
its other tasks being killed, and a KILLED status that reaches a driver already
stopping is logged as an RPC error.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

LOG4J2_FILE = Path(__file__).parent.parent / "log4j2.properties"
"""The project's log4j2 configuration (a copy of conf/log4j2.properties)."""

_LOG4J_PROPERTY = "log4j2.configurationFile"
_JAVA_OPTION_SOURCES = (
    "PYSPARK_SUBMIT_ARGS",
    "SPARK_SUBMIT_OPTS",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
)
_LOG4J_FILES = ("log4j2.properties", "log4j2.xml", "log4j2.yaml", "log4j2.yml", "log4j2.json")


def embedded_spark(
    executors: int = 2,
    app_name: str = "sparkdist",
    *,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
):
    """Get the active SparkSession, or start one: `master`, else a local-cluster with
    `executors` executors, quiet and on 127.0.0.1; `conf` adds Spark settings. A
    session started here is stopped when the interpreter exits (if still running)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings = {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.showConsoleProgress": "false",
        "spark.executor.memory": "1g",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        **(conf or {}),
    }
    settings.update(quiet_log4j_conf(settings, os.environ))
    builder = SparkSession.builder.master(master or f"local-cluster[{executors},1,1024]")
    builder = builder.appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    atexit.register(_stop_if_running, spark)
    return spark


def quiet_log4j_conf(conf: Mapping[str, str], env: Mapping[str, str]) -> dict[str, str]:
    """The Spark settings that make the driver JVM log with the project's log4j2 file,
    or none when the user chose a log4j2 configuration (a -Dlog4j2.configurationFile
    in `conf` or the usual Java option variables, or a log4j2 file in SPARK_CONF_DIR
    or SPARK_HOME/conf). It goes into the driver's default Java options, which come
    before (and so yield to) the user's `spark.driver.extraJavaOptions`."""
    key = "spark.driver.defaultJavaOptions"
    chosen = [conf.get(key, ""), conf.get("spark.driver.extraJavaOptions", "")]
    chosen += [env.get(name, "") for name in _JAVA_OPTION_SOURCES]
    if any(_LOG4J_PROPERTY in options for options in chosen):
        return {}
    conf_dirs = [env.get("SPARK_CONF_DIR"), env.get("SPARK_HOME") and f"{env['SPARK_HOME']}/conf"]
    if any(Path(d, name).is_file() for d in conf_dirs if d for name in _LOG4J_FILES):
        return {}
    if not LOG4J2_FILE.is_file():
        return {}
    option = f"-D{_LOG4J_PROPERTY}={LOG4J2_FILE.resolve().as_uri()}"
    return {key: f"{option} {conf.get(key, '')}".strip()}


def stop_session(spark, drain_timeout_s: float = 10.0) -> None:
    """Stop `spark` cleanly (see above): once no executor runs a task, or after
    `drain_timeout_s`, whichever comes first."""
    from sparkdist.spark.cluster import is_connect_session

    if not is_connect_session(spark):  # a Connect client has no executors of its own
        deadline = time.monotonic() + drain_timeout_s
        while _running_tasks(spark) and time.monotonic() < deadline:
            time.sleep(0.1)
    spark.stop()


def _running_tasks(spark) -> int:
    """How many tasks the executors are still running, as the driver knows it."""
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    return sum(info.numRunningTasks() for info in tracker.getExecutorInfos())


def _stop_if_running(spark) -> None:
    """Stop `spark` at interpreter exit, unless it was stopped already (see above)."""
    from pyspark import SparkContext

    if SparkContext._active_spark_context is spark.sparkContext:
        stop_session(spark)
