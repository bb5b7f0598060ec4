"""What sparkdist's processes share, wherever they run: the authenticated channels
(`wire`, served many at once by the driver's event server) keyed by the job's secret
(`job_secret`), the messages on them (`messages`, where other paths register theirs), a
rank's channel to the driver (`driver_channel`) and its half of the job's trace
(`rank_trace`), the payload (`payload`, `script`), the launch spec and command lines
(`launch`), a rank's stacks on its supervisor's request (`stack_dumps`) and those a
relayed job's supervisor cut off from its task leaves on its host (`left_stacks`), and
process helpers that let nothing outlive its job (`processes`), nor its temporary
directories outlive a SIGKILLed owner (`owned_dirs`).
"""
