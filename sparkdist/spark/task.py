"""What code running inside a Spark task asks of Spark: which partition it is, and how
many CPUs the task was given. Both answer sensibly outside a task too (a function
called directly), so the same code runs in tests and on the driver."""

from __future__ import annotations


def partition_id() -> int:
    """This Spark task's partition; -1 outside a task, which callers that need a part
    number read as 0."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return -1 if context is None else context.partitionId()


def task_cpus() -> int:
    """The CPUs Spark gave this task (`spark.task.cpus`); 1 outside a task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return 1 if context is None else max(1, context.cpus())
