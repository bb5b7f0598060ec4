"""The driver's half of checkpoints: the record of what was committed (`store`), which
outlives a job's attempts."""
