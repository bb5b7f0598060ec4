"""Runs in the processes of one rank: its `supervisor` (started by orted or by the task;
it streams the rank's output and reports its exit) and the rank itself (`main`: fetch
the payload, prepare the backends, run the user's function; a warm world's rank runs
one payload after another in `warm`, on a torch process group kept from run to run
by `kept_group`), with
`sparkdist.protocol.driver_channel`, the rank's link to the job's service
(`sparkdist.log_to_driver`, checkpoints).
"""
