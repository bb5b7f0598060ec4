# Databricks notebook source
# MAGIC %md
# MAGIC # 4. Horovod timeline: record it, bring it back, open it
# MAGIC
# MAGIC A Horovod timeline records, for every tensor, when each rank was ready, how long the
# MAGIC negotiation took and how long the allreduce itself ran: the first place to look when
# MAGIC distributed training is slower than it should be.
# MAGIC
# MAGIC Horovod writes it in rank 0's process, which runs on a worker. sparkdist brings the
# MAGIC file back and writes it on the driver, at the path you asked for, either with
# MAGIC `HorovodRunner(timeline=path)` or, as Databricks documents for HorovodRunner, with the
# MAGIC driver's `HOROVOD_TIMELINE` environment variable.

# COMMAND ----------

import json
import os
import tempfile

try:
    spark  # noqa: B018 - the notebook's SparkSession, on Databricks
except NameError:
    from sparkdist.spark.session import embedded_spark

    spark = embedded_spark(executors=2)

ON_DATABRICKS = "DATABRICKS_RUNTIME_VERSION" in os.environ
try:
    OUTPUT_DIR  # noqa: B018 - set by whoever runs this notebook (the tests do)
except NameError:
    # Under /dbfs/FileStore, a file can be downloaded from the browser (see the end).
    OUTPUT_DIR = "/dbfs/FileStore/sparkdist/timeline" if ON_DATABRICKS else tempfile.mkdtemp()
os.makedirs(OUTPUT_DIR, exist_ok=True)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Record: a short Horovod training job with `timeline=`
# MAGIC
# MAGIC The training function is the digits model of notebook 1, shipped with sparkdist.

# COMMAND ----------

from sparkdist import HorovodRunner
from sparkdist.demos.horovod_digits import train_digits_horovod

timeline_path = os.path.join(OUTPUT_DIR, "timeline.json")
runner = HorovodRunner(np=2, timeline=timeline_path)
result = runner.run(train_digits_horovod, epochs=3)
print(f"test accuracy {result['accuracy']:.4f}; timeline: {timeline_path}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## The other way: `HOROVOD_TIMELINE` on the driver
# MAGIC
# MAGIC Code written for Databricks' HorovodRunner sets the variable before `run`; it works
# MAGIC unchanged.

# COMMAND ----------

env_timeline_path = os.path.join(OUTPUT_DIR, "timeline_from_env.json")
os.environ["HOROVOD_TIMELINE"] = env_timeline_path
try:
    HorovodRunner(np=2).run(train_digits_horovod, epochs=1)
finally:
    del os.environ["HOROVOD_TIMELINE"]
print(f"timeline from HOROVOD_TIMELINE: {os.path.getsize(env_timeline_path)} bytes")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Look inside
# MAGIC
# MAGIC The file is Chrome's trace-event format: a JSON array of events. Each tensor is a
# MAGIC "process" (named by a metadata event); its phases (`NEGOTIATE_ALLREDUCE`, `ALLREDUCE`,
# MAGIC and inside it e.g. `MPI_ALLREDUCE` or `GLOO_ALLREDUCE`) are begin/end events with
# MAGIC timestamps in microseconds.

# COMMAND ----------

import pandas as pd

with open(timeline_path) as f:
    events = json.load(f)
tensors = {  # metadata events name each "process" (a tensor)
    e["pid"]: e["args"]["name"]
    for e in events
    if e.get("ph") == "M" and e.get("name") == "process_name" and "name" in e.get("args", {})
}
open_phases, durations = {}, []
for event in events:
    key = (event.get("pid"), event.get("tid"))
    if event.get("ph") == "B":
        open_phases.setdefault(key, []).append(event)
    elif event.get("ph") == "E" and open_phases.get(key):
        begin = open_phases[key].pop()
        durations.append(
            {
                "tensor": tensors.get(begin["pid"], "?"),
                "phase": begin.get("name", "?"),
                "ms": (event["ts"] - begin["ts"]) / 1000.0,
            }
        )
phases = pd.DataFrame(durations)
summary = (
    phases.groupby("phase")["ms"].agg(["count", "sum", "mean"]).sort_values("sum", ascending=False)
)
print(f"{len(events)} events, {len(tensors)} tensors")
print(summary.round(2).to_string())

# COMMAND ----------

# MAGIC %md
# MAGIC ## Where to open it
# MAGIC
# MAGIC * **Chrome / Edge:** open `chrome://tracing` (or `edge://tracing`), *Load* the file.
# MAGIC * **Perfetto:** https://ui.perfetto.dev, *Open trace file* (handles large files better).
# MAGIC * **On Databricks:** with the file under `/dbfs/FileStore/...`, download it from
# MAGIC   `https://<workspace-url>/files/...` (the path after `/dbfs/FileStore/`), then open it
# MAGIC   as above. From a Unity Catalog volume, download it from Catalog Explorer.
# MAGIC
# MAGIC Useful knobs, passed to the ranks with `HorovodRunner(env={...})`:
# MAGIC `HOROVOD_TIMELINE_MARK_CYCLES=1` marks Horovod's background cycles;
# MAGIC `HOROVOD_FUSION_THRESHOLD` and `HOROVOD_CYCLE_TIME` change what you will see fused.

# COMMAND ----------

if ON_DATABRICKS and timeline_path.startswith("/dbfs/FileStore/"):
    link = "/files/" + timeline_path[len("/dbfs/FileStore/") :]
    displayHTML(f'<a href="{link}" download>Download the timeline</a>')  # noqa: F821
else:
    print(f"open {timeline_path} in chrome://tracing or https://ui.perfetto.dev")
