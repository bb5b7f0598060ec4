"""Runs in a Spark task, on an executor: `spark_task.run_barrier_task` connects to the
job's service, writes the job's environment and starts the task's part of the job:
under mpirun a `agent.TaskAgent` (task 0 also starts mpirun, whose rsh agent is
`rsh`), under the direct launcher the supervisors of its ranks.
"""
