"""The runner path: HorovodRunner on a Spark barrier stage, launched through mpirun or
directly.

Split by the process the code runs in, as torch.distributed.elastic is:

* `driver/`: the driver's process (the front, the job's service and state, retries);
* `task/`: a Spark task on an executor (task agents, mpirun's rsh agent);
* `rank/`: a rank's supervisor and the rank itself.

What the three share (channels, messages, payload, launch spec, processes) is
`sparkdist.protocol`, a layer below the runner. Spark itself is reached only through
`sparkdist.spark`. The public names live in `sparkdist` (imported lazily there); this
package imports nothing, so rank processes load only the modules they use.
"""
