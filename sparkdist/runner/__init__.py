"""The runner path: HorovodRunner on a Spark barrier stage, launched through mpirun.

The public names live in `sparkdist` (imported lazily there); this package itself
imports nothing, so rank processes load only the modules they use.
"""
