"""Runs in the driver's process (or, in relay mode, in barrier task 0 in its place).

What a job is and how it ended (its options, the `JobSpec` every rank is told, its
`Outcome` and `JobReport`) is `job_spec`'s: read it first. `HorovodRunner` (the front:
options, payload) hands the job to `job.run_job`, whose one loop runs its attempts: each
forms the world by the job's launch kind (`launch/`: driver-local, barrier stage,
relayed stage, elastic gang; the job's authenticated `service.DriverService` filling a
`job_state.JobState`, whose parts are `records`), waits for it and relaunches it when
`failures` allows or its world is resized, and collects what it left (timeline, MLflow).
The job's checkpoint store is `sparkdist.checkpoint.driver.store`'s, opened once per
job. A warm world (`warm`) is one such job, run from a thread, whose ranks take one run
after another.
"""
