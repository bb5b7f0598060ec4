"""The errors a job raises on the driver, each saying what happened and what to do."""

from __future__ import annotations

import signal


class SparkdistError(RuntimeError):
    """Base class of sparkdist's errors."""

    stacks: str = ""
    """Where each rank was when the job ended (a time limit, a stall, a failure while
    other ranks ran): the grouped stacks the message ends with, or ""."""

    def with_stacks(self, text: str) -> SparkdistError:
        """Add where each rank was to the message (once); returns self."""
        self.stacks = text
        message = str(self.args[0]) if self.args else ""
        if text and text not in message:
            self.args = (f"{message}\n\n{text}", *self.args[1:])
        return self

    def __setstate__(self, state: dict) -> None:
        # An error rebuilt from its fields (`__reduce__`) gets its stacks back.
        stacks = state.pop("stacks", "")
        self.__dict__.update(state)
        if stacks:
            self.with_stacks(stacks)


class PayloadError(SparkdistError, TypeError):
    """The training function or its arguments cannot be sent to the ranks."""


class NotEnoughSlotsError(SparkdistError, ValueError):
    """More ranks were asked for than the cluster has task slots."""


class JobFailedError(SparkdistError):
    """The job failed outside any rank: a lost task or executor, mpirun, Spark itself.

    `output_tail` holds the launcher's (mpirun's) last lines, if any.
    """

    def __init__(self, reason: str, output_tail: list[str] | None = None):
        self.reason = reason
        self.output_tail = output_tail or []
        lines = [f"the job failed before any rank reported a failure: {reason}"]
        if self.output_tail:
            lines += ["", "Last lines of the launcher's output:"]
            lines += [f"  {line}" for line in self.output_tail]
        super().__init__("\n".join(lines))

    def __reduce__(self):
        # Rebuilt from its fields (a relayed job's error travels pickled to the client).
        return type(self), (self.reason, self.output_tail), {"stacks": self.stacks}


class JobTimeoutError(SparkdistError, TimeoutError):
    """The job (or its start-up) did not finish within its time limit."""


class JobStalledError(JobTimeoutError):
    """No rank showed a sign of life for the job's `stall_timeout` seconds."""


def describe_exit(exit_code: int | None) -> str:
    """'exit code 3' or 'signal SIGKILL (9)', as a person would say it."""
    if exit_code is None:
        return "an unknown exit status"
    if exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = "signal"
        return f"signal {name} ({-exit_code})"
    return f"exit code {exit_code}"


class RankFailedError(JobFailedError):
    """A rank raised or died. Reports the first failure, as torch elastic does."""

    def __init__(
        self,
        rank: int,
        host: str,
        exit_code: int | None,
        traceback: str | None,
        output_tail: list[str],
        reason: str | None = None,
    ):
        self.rank = rank
        self.host = host
        self.exit_code = exit_code
        self.traceback = traceback
        self.output_tail = output_tail
        self.reason = reason
        SparkdistError.__init__(self, self._message())

    def __reduce__(self):
        fields = (self.rank, self.host, self.exit_code, self.traceback, self.output_tail)
        return type(self), (*fields, self.reason), {"stacks": self.stacks}

    @property
    def signal(self) -> str | None:
        """The name of the signal that killed the rank, if one did."""
        if self.exit_code is not None and self.exit_code < 0:
            return describe_exit(self.exit_code).split()[1]
        return None

    def _message(self) -> str:
        if self.reason and self.exit_code is not None:
            what = f"{self.reason} ({describe_exit(self.exit_code)})"
        else:
            what = self.reason or f"ended with {describe_exit(self.exit_code)}"
        lines = [f"rank {self.rank} on host {self.host} failed first: {what}"]
        if self.traceback:
            lines += ["", f"Traceback from rank {self.rank}:", self.traceback.rstrip()]
        if self.output_tail:
            lines += ["", f"Last {len(self.output_tail)} lines of rank {self.rank}'s output:"]
            lines += [f"  {line}" for line in self.output_tail]
        return "\n".join(lines)


def exit_status(exit_code: int) -> int:
    """A child's exit code as a shell reports it: 128 + N for a death by signal N."""
    return exit_code if exit_code >= 0 else 128 - exit_code


class ConnectUnsupportedError(SparkdistError):
    """Something that needs a SparkContext was asked of a Spark Connect session."""
