"""The parts of a running job's state, one concern each, that `job_state.JobState`
composes: the job's description (`spec`), each rank's record (`ranks`), the Spark
tasks (`tasks`), the launcher (`launcher`), the open channels (`peers`), a
parameter-server job's servers (`servers`), how ends become failures (`losses`) and an
elastic job's growth (`growth`). They share the job's one lock (`JobState.cond`).
"""
