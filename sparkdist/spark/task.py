"""What code running inside a Spark task asks of Spark: which partition it is, how
many CPUs the task was given, and the task's context (a barrier task's, for its
`allGather` and its tasks' addresses). `partition_id` and `task_cpus` answer sensibly
outside a task too (a function called directly), so the same code runs in tests and
on the driver."""

from __future__ import annotations

from typing import Any


def task_context() -> Any:
    """This Spark task's `pyspark.TaskContext` (None outside a task)."""
    from pyspark import TaskContext

    return TaskContext.get()


def barrier_context() -> Any:
    """This barrier task's `pyspark.BarrierTaskContext`."""
    from pyspark import BarrierTaskContext

    return BarrierTaskContext.get()


def partition_id() -> int:
    """This Spark task's partition; -1 outside a task, which callers that need a part
    number read as 0."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return -1 if context is None else context.partitionId()


def task_attempt_id() -> int:
    """Spark's id of this task attempt (unique in the application; the driver maps it to
    the task's executor); -1 outside a task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return -1 if context is None else int(context.taskAttemptId())


def task_cpus() -> int:
    """The CPUs Spark gave this task (`spark.task.cpus`); 1 outside a task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return 1 if context is None else max(1, context.cpus())
