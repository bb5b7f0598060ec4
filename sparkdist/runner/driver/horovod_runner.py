"""`HorovodRunner`: the public entry point of the runner path.

    HorovodRunner(np=2).run(main, lr=0.1)

pickles `main` and its arguments here, on the driver, runs `main(**kwargs)` on every
rank, and returns rank 0's value. The front only checks the options and prepares the
payload; `job.run_job` launches it. See docs/architecture.md for the data flow, which
module runs in which process, the messages and the environment contract.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sparkdist.protocol import payload
from sparkdist.protocol.script import ScriptMain
from sparkdist.runner.driver import warm
from sparkdist.runner.driver.job import run_job
from sparkdist.runner.driver.job_spec import JobReport, RunnerOptions

logger = logging.getLogger(__name__)

__all__ = ["HorovodRunner", "JobReport"]


class HorovodRunner:
    """Run a training function on `np` ranks placed by a Spark barrier stage.

    Args:
        np: number of ranks. `np > 0`: on the cluster, one Spark barrier task per rank
            (or per `ranks_per_task` ranks).
            `np < 0`: `-np` ranks as subprocesses of the driver (for debugging).
        driver_log_verbosity: "all" streams every rank's stdout/stderr to the driver,
            each line prefixed with its rank; "log_callback_only" shows only
            `sparkdist.log_to_driver` messages (and errors). Either way, what reaches
            the driver is also kept per rank in `rank-N.log`, in the directory
            `last_job.rank_logs` names (docs/monitoring.md).
        launcher: "mpi" (mpirun started inside the barrier stage), "direct" (each
            task starts its ranks itself, no MPI), or "auto": mpi when `mpirun` is
            installed.
        start_timeout: seconds for the barrier stage to get its slots and every
            rank to start. An in-process elastic world (`sparkdist.elastic.run`) left
            below `min_np` waits as long for slots to come back before it relaunches
            (Horovod's `elastic_timeout`, 600 s by default too).
        timeout: seconds for the whole job; None for no limit. When it runs out, the
            error says where each rank was (their stacks, grouped).
        stall_warning: seconds without a sign of life from any rank (an output line, a
            `sparkdist.report`, a data loader batch, an elastic commit, a checkpoint)
            before the driver logs every rank's stack, grouped, and goes on (default
            300; None: never). Raise it for jobs of long silent steps.
        stall_timeout: seconds without a sign of life before the job fails with every
            rank's stack (default None: never), counted from each rank's first sign of
            life: a rank's start before it (imports, building a model) counts against
            start_timeout instead. In an in-process elastic job (`sparkdist.elastic.run`,
            min_np/max_np) each member is watched alone: one silent that long is dropped
            if it holds the others back (stopped, or stuck in its own code while the
            others wait in a collective): it is killed and the world goes on without it;
            the job fails only when no rank spoke for that long and none can be singled
            out, or fewer than min_np would be left. There, not given, it is 60 s and
            drops such ranks only (the job never fails of it). See "When a job hangs"
            in docs/troubleshooting.md and "A rank that stops without dying" in
            docs/elastic.md.
        env: extra environment variables for the ranks.
        mpi_args: extra arguments for mpirun (e.g. ["--mca", "btl_tcp_links", "2"]).
        network_interface: the interface (e.g. "eth0") the ranks and sparkdist's
            channels use; by default the one carrying each executor's address.
        timeline: a path on the driver for a Horovod timeline of the job (rank 0
            records it wherever it runs; the driver writes it here). By default the
            driver's HOROVOD_TIMELINE environment variable, as on Databricks.
        trace: write the job's trace (on by default): a Chrome trace JSON of every
            rank's launch, steps, data waits, checkpoints, stalls and failures and the
            world's changes, beside the rank logs (`last_job.trace`); its picture is
            `last_job.timeline()` (docs/monitoring.md).
        max_failures: how many times a job that failed for a reason outside the
            training code (a lost executor or host, a killed rank) is relaunched as a
            whole. `main` resumes from `sparkdist.checkpoint.latest()`. Not given: 0 for
            a fixed-size job, no limit for an elastic one (min_np/max_np), whose
            relaunches min_np and start_timeout bound.
        retry_on_exception: also relaunch when the training code raised (by default an
            exception in `main` fails the job at once: a relaunch would repeat it).
        checkpoint_dir: a directory on the driver for the checkpoints ranks save with
            `sparkdist.checkpoint.save`; kept, so a later run resumes from it. By
            default a temporary directory, removed when `run` returns. Sharded saves
            (FSDP2/DTensor states, `sharded=True`) are written there by every rank, so
            it must then be storage every executor sees (/dbfs, /Volumes, a mounted
            file system, an fsspec URL). The driver path refuses states over
            `SPARKDIST_CHECKPOINT_DRIVER_LIMIT_MB` (512 by default) in the ranks' env.
        checkpoint_keep: how many of the newest checkpoints are kept (either path); one
            a relaunched rank is still loading is kept until it has.
        ranks_per_task: ranks each Spark barrier task starts (`np > 0`; np must be a
            multiple). Ranks of one task share its resources: with
            `spark.task.resource.gpu.amount=4` and ranks_per_task=4, each task's four
            ranks split its four GPUs. Local ranks count within a task.
        roles: ranks with roles, for TensorFlow's ParameterServerStrategy: e.g.
            `{"chief": 1, "worker": 2, "ps": 1}` (they must add up to np). Rank 0 is
            the chief and runs `main` (the coordinator); the worker and ps ranks run
            TensorFlow servers, stopped when the chief returns. See "Parameter servers"
            in docs/parameter-servers.md.
        min_np, max_np: make the job elastic (either one, the other defaults to np): it
            starts as soon as min_np ranks' slots are free, with as many ranks as the
            cluster holds up to max_np; after a lost executor it goes on at once with the
            ranks the remaining slots hold (counted by `max_failures`, no limit by
            default), and when more slots stay free it grows at rank 0's next
            `sparkdist.checkpoint.save`. Runs where Spark's dynamic allocation is on.
            See "Elastic training" in docs/elastic.md.
        report_ranks: whose `sparkdist.report` metrics the driver shows and logs to its
            active MLflow run: "rank0" (rank 0's, under their own names) or "all" (every
            rank's, named `rank<k>/<metric>` in MLflow). `last_job.reported` keeps all.
        keep_warm: seconds the ranks stay, idle, after a run (default None: they end with
            it). The next run of the same shape (np, ranks_per_task, launcher, env...),
            from this runner or a new one in the same driver process, runs in the same
            processes: what earlier runs imported or loaded into a module is still there.
            The world holds its cluster slots until it is idle that long, `close()` is
            called (or the `with` block ends), a run of another shape comes, a run fails,
            or the driver exits. See "Warm worlds" in docs/warm-worlds.md.
    """

    def __init__(
        self,
        *,
        np: int,
        driver_log_verbosity: str = RunnerOptions.driver_log_verbosity,
        launcher: str = RunnerOptions.launcher,
        start_timeout: float = RunnerOptions.start_timeout,
        timeout: float | None = RunnerOptions.timeout,
        stall_warning: float | None = RunnerOptions.stall_warning,
        stall_timeout: float | None = RunnerOptions.stall_timeout,
        env: Mapping[str, str] | None = None,
        mpi_args: Sequence[str] = RunnerOptions.mpi_args,
        network_interface: str | None = RunnerOptions.network_interface,
        timeline: str | os.PathLike | None = RunnerOptions.timeline,
        trace: bool = RunnerOptions.trace,
        max_failures: int | None = RunnerOptions.max_failures,
        retry_on_exception: bool = RunnerOptions.retry_on_exception,
        checkpoint_dir: str | os.PathLike | None = RunnerOptions.checkpoint_dir,
        checkpoint_keep: int = RunnerOptions.checkpoint_keep,
        ranks_per_task: int = RunnerOptions.ranks_per_task,
        roles: Mapping[str, int] | str | None = RunnerOptions.roles,
        min_np: int | None = RunnerOptions.min_np,
        max_np: int | None = RunnerOptions.max_np,
        report_ranks: str = RunnerOptions.report_ranks,
        keep_warm: float | None = RunnerOptions.keep_warm,
    ):
        # The defaults are RunnerOptions' (its dataclass fields are class attributes), so
        # they are stated once; the keywords stay spelled out for editors and help().
        given = {name: value for name, value in locals().items() if name != "self"}
        self.options = RunnerOptions(**{**given, "env": env or {}})
        self.last_job: JobReport | None = None
        self._warm_world: warm.WarmWorld | None = None

    def __enter__(self) -> HorovodRunner:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Release the warm world this runner's runs used (`keep_warm`): its ranks end
        and its cluster slots come back. Nothing to do without one."""
        world, self._warm_world = self._warm_world, None
        warm.release(world, "the runner was closed")

    def run(self, main: Callable[..., Any] | str | os.PathLike, **kwargs: Any) -> Any:
        """Run `main(**kwargs)` on every rank; return rank 0's return value.

        `main` may also be the path of a Python script, run on every rank as
        `__main__` with `args` as its command-line arguments:
        `run("train.py", args=["--epochs", "3"])`. A non-zero exit is a failure.
        """
        return self._run(main, kwargs, all_results=False)[0]

    def run_all(self, main: Callable[..., Any] | str | os.PathLike, **kwargs: Any) -> list[Any]:
        """Like `run`, but return every rank's value, in rank order."""
        return self._run(main, kwargs, all_results=True)

    def _run(self, main: Callable | str | os.PathLike, kwargs: dict[str, Any], all_results: bool):
        main, kwargs = _script_or_function(main, kwargs)
        # DataFrames become converters; the copies written for this job go when it ends.
        with converted_dataframes(kwargs) as arguments:
            blob = payload.pack(main, arguments)
            opts = self.options
            self.last_job = JobReport(
                job_id="",
                np=opts.np,
                launcher=opts.resolved_launcher(),
                name=_name_of(main),
                payload_bytes=len(blob),
            )
            if opts.keep_warm is None:
                return run_job(opts, blob, all_results, self.last_job)
            self._warm_world, results = warm.run_warm(opts, blob, all_results, self.last_job)
            return results


def _name_of(main: Callable) -> str:
    """The name the driver shows for the job (progress, Spark UI)."""
    if isinstance(main, ScriptMain):
        return os.path.basename(main.path)
    return getattr(main, "__name__", None) or type(main).__name__


def _script_or_function(main, kwargs: dict[str, Any]) -> tuple[Callable, dict[str, Any]]:
    """A script path becomes a `ScriptMain` run with its `args`; a function stays."""
    if not isinstance(main, (str, os.PathLike)):
        return main, kwargs
    unexpected = set(kwargs) - {"args"}
    if unexpected:
        raise ValueError(
            f"a script takes only args=[...], not {sorted(unexpected)}; pass options "
            "to the script as command-line arguments"
        )
    return ScriptMain.from_file(main, kwargs.get("args", ())), {}


@contextmanager
def converted_dataframes(kwargs: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """`kwargs` with every Spark DataFrame replaced by a converter, for the job's length.

    `run(main, train=df)` hands `main` a converter (`sparkdist.data`) instead of the
    DataFrame: each rank reads its own rows from Parquet, nothing goes into the payload.
    A DataFrame that is a plain Parquet or Delta scan is read in place; any other is
    copied once, and that copy is removed when the job ends, whether it succeeded,
    failed or was interrupted. A copy the job did not write (the user's own converter of
    the same DataFrame, reused) is left alone.
    """
    if "pyspark" not in sys.modules:
        yield kwargs
        return
    from pyspark.sql import DataFrame

    frames = [key for key, value in kwargs.items() if isinstance(value, DataFrame)]
    if not frames:
        yield kwargs
        return
    from sparkdist.data.driver.convert import ConversionOptions, convert

    options = ConversionOptions(tensor_types="torch")  # sparkdist's own API: torch.bool

    converted = dict(kwargs)
    written = []
    try:
        for key in frames:
            conversion = convert(kwargs[key], options)
            converted[key] = conversion.converter
            if conversion.wrote_copy:
                written.append(conversion.converter)
            logger.info("DataFrame argument %r arrives in the ranks as a converter handle", key)
        yield converted
    finally:
        for converter in written:
            try:
                converter.delete()
            except Exception as error:  # the job's own outcome is what to report
                logger.warning(
                    "could not remove the copy at %s: %r", converter.cache_dir_url, error
                )
