"""A rank's half of checkpoints: rank 0's state through the driver (`driver_path`), every
rank's shard on shared storage (`sharded`, `tensorflow`), and the link to the driver's
record that both use (`driver_record`)."""
