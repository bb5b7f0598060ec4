"""A rank's half of the data path: its rows of each epoch's global order, decoded and cut
into batches for torch, TensorFlow or numpy."""
