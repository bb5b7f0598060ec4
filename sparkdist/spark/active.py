"""The choice of a `Cluster` for the active session: classic or Spark Connect.

It sits above both implementations (`classic.py`, `connect.py`) and the interface
(`cluster.py`), so that none of them imports another through it.
"""

from __future__ import annotations

from sparkdist.errors import SparkdistError
from sparkdist.spark.cluster import Cluster, is_connect_session


def active_cluster(what: str = "np > 0 runs on a Spark cluster") -> Cluster:
    """The active session's `Cluster`, found as pyspark finds it for both kinds
    (`SparkSession.active()`: this thread's session, else the default one)."""
    from pyspark.sql import SparkSession

    try:
        session = SparkSession.active()
    except Exception:  # noqa: BLE001 - pyspark's NO_ACTIVE_OR_DEFAULT_SESSION
        session = None
    if session is None:
        sc = _active_spark_context()
        if sc is not None:  # a SparkContext made without a SparkSession
            from sparkdist.spark.classic import ClassicSpark

            return ClassicSpark(sc)
        raise SparkdistError(
            f"{what}, but no SparkSession is active. Start one "
            "(SparkSession.builder.getOrCreate(), or .remote('sc://host:15002') for Spark "
            "Connect) or use np < 0 to run on the driver."
        )
    from sparkdist.spark.connect import ConnectSpark

    if is_connect_session(session):
        return ConnectSpark(session)
    from sparkdist.spark.classic import ClassicSpark

    return ClassicSpark(session.sparkContext)


def _active_spark_context():
    try:
        from pyspark import SparkContext
    except ImportError:  # pyspark-client: Connect only
        return None
    return SparkContext._active_spark_context
