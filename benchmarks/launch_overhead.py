"""Launch overhead: a trivial 2-rank torch job, sparkdist side by side with its peers.

On one warm local-cluster[2,1,1024] session, times REPEAT runs each of a job that
initialises the process group, does one allreduce and returns a float, with:

* sparkdist HorovodRunner: mpi and direct launchers, np=2 (cluster) and np=-2 (driver),
  np=2 also with TLS off on its channels (`SPARKDIST_TLS=0`; encryption_overhead.py
  alternates on and off for a finer comparison);
* sparkdist.TorchDistributor (pyspark's API on HorovodRunner), local_mode False and True;
* pyspark's TorchDistributor, local_mode False and True;
* horovod.spark.run (Gloo), where Horovod is installed;
* through a Spark Connect session (a LocalConnectServer over local-cluster[3,1,1024],
  driven by a client process with no JVM): sparkdist np=2 with the executors reaching the
  client and in relay mode, a warm world in relay mode (runs 2.., the third slot free for
  the Spark tasks that carry its runs), and pyspark's TorchDistributor on the same Connect
  session;
* Ray on Spark (`setup_ray_cluster`, then repeated `TorchTrainer.fit`, np=2 and np=8), run
  by benchmarks/ray_on_spark.py in .venv-ray (`make bench-ray`), when that exists.

Prints the median and min per launcher and the ratio to TorchDistributor(local_mode=False)
of the same kind of session, and how far sparkdist.TorchDistributor is from the
HorovodRunner it runs on. A second table shows the worlds set up once and kept between
runs: sparkdist's warm worlds (`keep_warm`: np=2 and np=8, direct and mpi, np=-2; and a
job whose ranks hold a 1 GB model, `--model-mb`, loaded by its first run, warm against
cold) and Ray on Spark: the setup, run 1 and the median and min of runs 2 to REPEAT. Then
a third: a short PyTorch Lightning fit (2 ranks, DDP) through sparkdist.TorchDistributor
and pyspark's, LIGHTNING_REPEAT runs each.

    .venv/bin/python benchmarks/launch_overhead.py [--repeat 5] [--lightning-repeat 3]
        [--no-connect] [--no-ray] [--only REGEX]

`--only 'np=2|local_mode=False'` measures just the rows whose name matches (here the
cluster rows and their baselines, classic and Connect), without the Lightning table.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import time

import bench_table  # a sibling script, not a package

RAY_PYTHON = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv-ray", "bin", "python"
)
RAY_WORLDS = (2, 8)


def torch_job() -> float:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    dist.destroy_process_group()
    return value.item()


def lightning_job() -> int:
    """Two epochs of a linear regression with Lightning's DDP; returns the world size."""
    import pytorch_lightning as pl
    import torch

    class Regression(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    x = torch.randn(256, 4)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        num_nodes=2,
        strategy="ddp",
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regression(), torch.utils.data.DataLoader(data, batch_size=32))
    return trainer.world_size


def model_job(path: str) -> float:
    """Rank 0's sum of a model's weights, loaded from `path` by the first run on a warm
    world and kept in a module of the rank's process for the next (docs/warm-worlds.md)."""
    import sys
    import types

    import torch

    kept = sys.modules.setdefault("bench_kept", types.ModuleType("bench_kept"))
    if getattr(kept, "path", None) != path:
        kept.model, kept.path = torch.load(path), path
    return float(kept.model["weight"][:1000].sum())


def warm_rows(repeat: int, only: str | None, model_mb: int) -> list[tuple]:
    """(name, None, run 1 s, runs 2..repeat median s, min s) for each warm world (closed
    after its runs), as `print_kept_table` takes them."""
    from sparkdist import HorovodRunner

    worlds = [
        ("warm direct np=2", dict(np=2, launcher="direct")),
        ("warm mpi np=2", dict(np=2, launcher="mpi")),
        ("warm direct np=8 (4 ranks per task)", dict(np=8, launcher="direct", ranks_per_task=4)),
        ("warm mpi np=8 (4 ranks per task)", dict(np=8, launcher="mpi", ranks_per_task=4)),
        ("warm direct np=-2", dict(np=-2, launcher="direct")),
    ]
    rows = []
    for name, options in worlds:
        if only and not re.search(only, name):
            continue
        expected = (float(sum(range(1, abs(options["np"]) + 1))),)
        with HorovodRunner(keep_warm=600, start_timeout=300, **options) as runner:
            times = [time_one(lambda: runner.run(torch_job), expected) for _ in range(repeat)]
        rest = times[1:]
        rows.append((f"sparkdist {name}", None, times[0], statistics.median(rest), min(rest)))
        print(f"  measured {name}: run 1 {times[0]:.2f}s, then {times[1:]}", flush=True)
    if model_mb:
        rows += model_rows(repeat, model_mb)
    return rows


def model_rows(repeat: int, model_mb: int) -> list[tuple]:
    """A job whose ranks load a `model_mb` MB model: cold (each run a new job that loads
    it) and warm (loaded by run 1, kept for the next)."""
    import tempfile

    import torch

    from sparkdist import HorovodRunner

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.pt")
        weight = torch.ones(model_mb * 2**20 // 4)
        torch.save({"weight": weight}, path)
        del weight
        rows = []
        for label, keep in (("cold", None), ("warm", 600)):
            with HorovodRunner(np=2, launcher="direct", keep_warm=keep) as runner:
                times = [
                    time_one(lambda: runner.run(model_job, path=path), (1000.0,))
                    for _ in range(repeat)
                ]
            name = f"sparkdist direct np=2, {model_mb} MB model, {label}"
            rest = times[1:]
            rows.append((name, None, times[0], statistics.median(rest), min(rest)))
            print(f"  measured {name}: {times}", flush=True)
    return rows


def horovod_job() -> float:
    import horovod.torch as hvd
    import torch

    hvd.init()
    value = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    hvd.shutdown()
    return value.item()


def without_tls(fn):
    """`fn` run with the job channels' TLS turned off (benchmarks only)."""
    from sparkdist.protocol.job_secret import TLS_ENV

    def run():
        os.environ[TLS_ENV] = "0"
        try:
            return fn()
        finally:
            del os.environ[TLS_ENV]

    return run


def contenders(spark):
    from sparkdist import HorovodRunner

    def sparkdist_run(np, launcher, **options):
        return lambda: HorovodRunner(np=np, launcher=launcher, **options).run(torch_job)

    yield "sparkdist mpi np=2", sparkdist_run(2, "mpi")
    # Elastic: plain tasks seated by the job's gang instead of a barrier stage.
    yield "sparkdist mpi np=2, elastic 1..2", sparkdist_run(2, "mpi", min_np=1, max_np=2)
    yield "sparkdist direct np=2", sparkdist_run(2, "direct")
    # Encryption off (SPARKDIST_TLS=0): what TLS on the job's channels costs.
    yield "sparkdist mpi np=2, TLS off", without_tls(sparkdist_run(2, "mpi"))
    yield "sparkdist direct np=2, TLS off", without_tls(sparkdist_run(2, "direct"))
    yield "sparkdist mpi np=-2", sparkdist_run(-2, "mpi")
    yield "sparkdist direct np=-2", sparkdist_run(-2, "direct")

    import sparkdist

    def sparkdist_distributor(local_mode):
        return lambda: sparkdist.TorchDistributor(2, local_mode=local_mode, use_gpu=False).run(
            torch_job
        )

    yield "sparkdist TorchDistributor local_mode=False", sparkdist_distributor(False)
    yield "sparkdist TorchDistributor local_mode=True", sparkdist_distributor(True)

    from pyspark.ml.torch.distributor import TorchDistributor

    def distributor(local_mode):
        return lambda: TorchDistributor(num_processes=2, local_mode=local_mode, use_gpu=False).run(
            torch_job
        )

    yield "TorchDistributor local_mode=False", distributor(False)
    yield "TorchDistributor local_mode=True", distributor(True)

    try:
        import horovod.spark
        import horovod.torch  # noqa: F401
    except ImportError as exc:
        yield f"horovod.spark.run (not installed: {exc})", None
    else:
        yield (
            "horovod.spark.run (gloo)",
            lambda: horovod.spark.run(horovod_job, num_proc=2, use_gloo=True, verbose=0),
        )


def connect_contenders():
    """The rows measured from a Spark Connect client (this script with --connect-client)."""
    from sparkdist import HorovodRunner

    def sparkdist_run(launcher, relay):
        return sparkdist_run_on(HorovodRunner(np=2, launcher=launcher), relay)

    def sparkdist_run_on(runner, relay):
        def run():
            os.environ["SPARKDIST_CONNECT_RELAY"] = relay
            return runner.run(torch_job)

        return run

    yield "Connect: sparkdist mpi np=2", sparkdist_run("mpi", "auto")
    yield "Connect: sparkdist direct np=2", sparkdist_run("direct", "auto")
    yield "Connect: sparkdist mpi np=2, relay mode", sparkdist_run("mpi", "always")
    yield "Connect: sparkdist direct np=2, relay mode", sparkdist_run("direct", "always")
    # A warm world in relay mode: measure's warm-up is run 1, which starts it; the timed
    # runs are carried to it (it takes 3 slots: the ranks' 2 and one for the carriers).
    warm = HorovodRunner(np=2, launcher="direct", keep_warm=600)
    yield "Connect: sparkdist warm direct np=2, relay mode", sparkdist_run_on(warm, "always")
    warm.close()  # its slots back for the rows after it

    from pyspark.ml.torch.distributor import TorchDistributor

    yield (
        "Connect: TorchDistributor local_mode=False",
        lambda: TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(torch_job),
    )


def connect_client(url: str, repeat: int, only: str | None) -> None:
    from pyspark.sql import SparkSession

    SparkSession.builder.remote(url).getOrCreate()
    for name, fn in connect_contenders():
        if only and not re.search(only, name):
            continue
        times = measure(fn, repeat)
        print("ROW " + json.dumps([name, statistics.median(times), min(times)]), flush=True)


def connect_rows(repeat: int, only: str | None) -> list[tuple[str, float | None, float | None]]:
    """Start a Connect server and measure the Connect rows from a client process."""
    from sparkdist.spark.connect_server import LocalConnectServer

    rows = []
    with LocalConnectServer(executors=3) as server:
        argv = [sys.executable, __file__, "--connect-client", server.url, "--repeat", str(repeat)]
        proc = subprocess.run(
            argv + (["--only", only] if only else []), capture_output=True, text=True
        )
    for line in proc.stdout.splitlines():
        if line.startswith("ROW "):
            name, median, best = json.loads(line[4:])
            rows.append((name, median, best))
            print(f"  measured {name}: median {median:.2f}s", flush=True)
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit("the Connect client failed")
    return rows


def ray_rows(repeat: int, only: str | None) -> list[tuple]:
    """The Ray on Spark rows, (name, setup s, run 1 s, runs 2.. median s, min s), measured
    by ray_on_spark.py in .venv-ray (its own Spark session, after this one stopped)."""
    worlds = [np for np in RAY_WORLDS if not only or re.search(only, ray_row_name(np))]
    if not worlds:
        return []
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ray_on_spark.py")
    argv = [RAY_PYTHON, script, "--runs", str(max(repeat, 2)), "--np", *map(str, worlds)]
    ours = ("PYTHONPATH", "VIRTUAL_ENV", "SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
    env = {key: value for key, value in os.environ.items() if key not in ours}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        print(proc.stderr[-3000:], file=sys.stderr)
        return [
            (f"{ray_row_name(np)} (failed, see above)", None, None, None, None) for np in worlds
        ]
    result = json.loads(lines[-1])
    rows = []
    for row in result["rows"]:
        name = row["name"] + (f" (failed: {row['error'][:60]})" if "error" in row else "")
        rows.append((name, result["setup_s"], row["run1"], row["rest_median"], row["rest_min"]))
        fits = ", ".join(f"{seconds:.2f}" for seconds in row["times"])
        print(f"  measured {name}: fits {fits} s", flush=True)
    print(
        f"  Ray on Spark: setup_ray_cluster {result['setup_s']:.2f}s, peak memory of its "
        f"processes {result['peak_rss_mb']:.0f} MB, new worker pids every fit: "
        f"{not any(row['pids_reused'] for row in result['rows'])}, left running after it: "
        f"{result['left_over_120s_after_exit'] or 'none'}",
        flush=True,
    )
    return rows


def wants_ray(flag: bool | None) -> bool:
    """Whether to measure the Ray on Spark rows: --ray, --no-ray, or by default when
    .venv-ray exists (else says so)."""
    if flag is None and not os.path.exists(RAY_PYTHON):
        print(f"  Ray on Spark rows skipped: no {RAY_PYTHON} (`make bench-ray` builds it)")
    return flag if flag is not None else os.path.exists(RAY_PYTHON)


def ray_row_name(np: int) -> str:
    return f"Ray on Spark TorchTrainer.fit np={np}"


def print_kept_table(rows: list[tuple], repeat: int, baseline: float | None) -> None:
    """The launchers whose world is set up once and kept between runs: rows of (name, setup
    s, run 1 s, runs 2.. median s, runs 2.. min s); None prints as n/a."""

    def cell(value, width, digits=2):
        return f"{value:>{width}.{digits}f}" if value is not None else f"{'n/a':>{width}}"

    print()
    title = f"Kept between runs: the world set up once, then {repeat} runs of the same job"
    rest = f"runs 2-{repeat} median s"
    lines = [
        title,
        f"{'launcher':<52} {'setup s':>8} {'run 1 s':>8} {rest:>19} {'min s':>7} {'x TD':>6}",
    ]
    cells = []
    for name, setup, first, median, best in rows:
        ratio = f"{median / baseline:.3f}x" if baseline and median is not None else "n/a"
        lines.append(
            f"{name:<52} {cell(setup, 8)} {cell(first, 8)} {cell(median, 19, 3)} "
            f"{cell(best, 7, 3)} {ratio:>6}"
        )
        cells.append([name, setup, first, median, best, ratio])
    lines.append(
        "x TD: runs 2.. median over TorchDistributor local_mode=False's median (first table)"
    )
    columns = ["launcher", "setup s", "run 1 s", rest, "min s", "x TD"]
    bench_table.print_table("kept", title, columns, cells, text="\n".join(lines))


def lightning_contenders():
    from pyspark.ml.torch.distributor import TorchDistributor

    import sparkdist

    yield (
        "sparkdist TorchDistributor local_mode=False",
        lambda: sparkdist.TorchDistributor(2, local_mode=False, use_gpu=False).run(lightning_job),
    )
    yield (
        "TorchDistributor local_mode=False",
        lambda: TorchDistributor(2, local_mode=False, use_gpu=False).run(lightning_job),
    )


def time_one(fn, expected) -> float:
    """Wall time of one run of `fn`, whose output is kept off the table; it must return one
    of `expected`."""
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        value = fn()
    elapsed = time.perf_counter() - started
    if value not in expected:
        raise AssertionError(f"wrong result {value!r}, expected one of {expected!r}")
    return elapsed


def measure(fn, repeat: int, expected=(3.0, [3.0, 3.0])) -> list[float]:
    """Wall times of `repeat` runs after a warm-up; each must return one of `expected`
    (the allreduce's sum by default)."""
    fn()  # warm-up: imports, JIT of Spark's code paths
    return [time_one(fn, expected) for _ in range(repeat)]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--lightning-repeat", type=int, default=3)
    parser.add_argument("--no-connect", action="store_true", help="skip the Spark Connect rows")
    parser.add_argument(
        "--ray",
        action=argparse.BooleanOptionalAction,
        help="the Ray on Spark rows (default: when .venv-ray exists; `make bench-ray`)",
    )
    parser.add_argument(
        "--only", metavar="REGEX", help="only the rows whose name matches; no Lightning table"
    )
    parser.add_argument(
        "--model-mb", type=int, default=1024, help="the warm table's model size; 0: no model rows"
    )
    parser.add_argument("--warm-only", action="store_true", help="only the warm worlds' table")
    parser.add_argument("--connect-client", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ray and not os.path.exists(RAY_PYTHON):
        parser.error(f"--ray needs {RAY_PYTHON} (`make bench-ray` builds it)")
    return args


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.ERROR)
    if args.connect_client:
        connect_client(args.connect_client, args.repeat, args.only)
        return

    from sparkdist.spark.session import embedded_spark

    spark = embedded_spark(executors=2, app_name="sparkdist-bench")
    rows = []
    warm = warm_rows(max(args.repeat, 2), args.only, args.model_mb)
    for name, fn in contenders(spark) if not args.warm_only else ():
        if args.only and not re.search(args.only, name):
            continue
        if fn is None:
            rows.append((name, None, None))
            continue
        times = measure(fn, args.repeat)
        rows.append((name, statistics.median(times), min(times)))
        print(f"  measured {name}: median {statistics.median(times):.2f}s", flush=True)
    lightning_rows = []
    for name, fn in lightning_contenders() if not (args.only or args.warm_only) else ():
        times = measure(fn, args.lightning_repeat, expected=(2,))
        lightning_rows.append((name, statistics.median(times), min(times)))
        print(f"  measured Lightning, {name}: median {statistics.median(times):.2f}s", flush=True)

    spark.stop()
    kept_rows = warm + (ray_rows(args.repeat, args.only) if wants_ray(args.ray) else [])
    if not (args.no_connect or args.warm_only):
        rows += connect_rows(args.repeat, args.only)

    medians = print_first_table(rows, args.repeat)
    if kept_rows:
        print_kept_table(kept_rows, args.repeat, medians.get("TorchDistributor local_mode=False"))

    print_lightning_table(lightning_rows, args.lightning_repeat)


def print_first_table(rows: list[tuple], repeat: int) -> dict[str, float | None]:
    """The cold rows, each against pyspark's TorchDistributor of its kind of session;
    their medians by name."""
    medians = {n: m for n, m, _ in rows}
    print()
    title = f"Trivial 2-rank torch job, {repeat} runs each, warm local-cluster[2,1,1024]"
    lines = [title, f"{'launcher':<46} {'median s':>9} {'min s':>7} {'x TorchDistributor':>19}"]
    cells = []
    for name, median, best in rows:
        if median is None:
            lines.append(f"{name:<46} {'n/a':>9}")
            cells.append([name, None, None, None])
            continue
        prefix = "Connect: " if name.startswith("Connect: ") else ""
        baseline = medians.get(f"{prefix}TorchDistributor local_mode=False")
        ratio = f"{median / baseline:.2f}x" if baseline else "n/a"
        lines.append(f"{name:<46} {median:>9.2f} {best:>7.2f} {ratio:>19}")
        cells.append([name, median, best, ratio])
    columns = ["launcher", "median s", "min s", "x TorchDistributor"]
    bench_table.print_table("launch", title, columns, cells, text="\n".join(lines))

    for mode, runner in (("False", "sparkdist mpi np=2"), ("True", "sparkdist mpi np=-2")):
        ours = medians.get(f"sparkdist TorchDistributor local_mode={mode}")
        if ours is None or runner not in medians:
            continue
        print(
            f"sparkdist TorchDistributor local_mode={mode} vs HorovodRunner ({runner[10:]}): "
            f"{100 * (ours / medians[runner] - 1):+.1f}%"
        )
    return medians


def print_lightning_table(rows: list[tuple], repeat: int) -> None:
    """The Lightning fits, against pyspark's (the last row); nothing without rows."""
    if not rows:
        return
    print()
    title = f"PyTorch Lightning fit (2 ranks, DDP, 2 epochs), {repeat} runs each, same session"
    lines = [title, f"{'launcher':<46} {'median s':>9} {'min s':>7} {'x TorchDistributor':>19}"]
    baseline = rows[-1][1]
    for name, median, best in rows:
        lines.append(f"{name:<46} {median:>9.2f} {best:>7.2f} {median / baseline:>18.2f}x")
    cells = [[name, median, best, median / baseline] for name, median, best in rows]
    columns = ["launcher", "median s", "min s", "x TorchDistributor"]
    bench_table.print_table("lightning", title, columns, cells, text="\n".join(lines))


if __name__ == "__main__":
    main()
