"""Runs in the driver's process (or, in relay mode, in barrier task 0 in its place).

`HorovodRunner` (the front: options, payload) hands the job to `job.run_job`, which
places it (`service.DriverService`, the job's authenticated server, filling a
`job_state.JobState`), launches it (`stage.BarrierStage` on Spark, `local_launch` for
np < 0), waits for it (`failures`), relaunches it when `retry` allows, and collects
what it left (checkpoints, timeline, MLflow).
"""
