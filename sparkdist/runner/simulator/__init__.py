"""The scale simulator: the driver's real service and job state, and N simulated Spark
tasks, supervisors and ranks that speak the real protocol (TLS, HMAC, the messages of
`sparkdist.protocol.messages`) from a few worker processes, to measure how the driver's
cost grows with the world: time to form it, to deliver the payload, to stream the ranks
lines and to collect their results; the driver's CPU, memory, threads and bytes sent.

* `hosts.py`: what runs in a worker process: its share of the simulated hosts (one Spark
  task and its ranks' supervisors and ranks each), phase by phase;
* `simulation.py`: the driver's side (the measuring process): the real `JobState` and
  `DriverService`, the worker processes, the phases and what they cost;
* `curve.py`: the curve from 16 to 1,024 ranks and its table (`python -m
  sparkdist.runner.simulator` prints it; `benchmarks/scale.py` uses it).

A tool for tests and benchmarks: no library code imports it (an import-linter contract).
"""
