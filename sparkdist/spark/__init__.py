"""The one place that talks to Spark.

Every path (the runner, ensembles, data, tune, tracking) reaches Spark through this
package: `active_cluster()` gives the active session as a `Cluster` (classic or Spark
Connect behind one interface) that runs barrier stages and plain jobs under a tag,
cancels them, counts slots and says where a job's service can listen; `session`
starts an embedded Spark, `connect_server` a local Spark Connect server.

Only the light names are imported here; pyspark is imported when a session is used.
"""

from sparkdist.spark.active import active_cluster
from sparkdist.spark.cluster import (
    BarrierTask,
    Cluster,
    PlainTask,
    ServicePlace,
    is_connect_session,
    job_tag,
    python_error_in,
    require_classic,
    spark_error_summary,
)
from sparkdist.spark.slots import configured_slots, session_slots

__all__ = [
    "BarrierTask",
    "Cluster",
    "PlainTask",
    "ServicePlace",
    "active_cluster",
    "configured_slots",
    "is_connect_session",
    "job_tag",
    "python_error_in",
    "require_classic",
    "session_slots",
    "spark_error_summary",
]
