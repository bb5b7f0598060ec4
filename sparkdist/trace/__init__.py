"""A job's timeline: the trace file every job writes (`format.py`), and its picture."""
