"""The docs' figures, drawn from the tables the benchmarks write as JSON (bench_table.py).

    .venv/bin/python benchmarks/figures.py [--data build/bench] [--out build/bench/figures]
    .venv/bin/python benchmarks/figures.py --data docs/figures/data --out docs/figures

`make bench` runs it last, on what its benchmarks wrote. docs/figures/ holds the committed
figures and, in data/, the JSON they are drawn from: measured here, or transcribed from
the published tables where a benchmark cannot run here (each table's "source" says which;
the figure prints it under the plot). A figure whose data is missing is skipped with a line
saying so.

* launch-curve: launch time against ranks, sparkdist's launchers and TorchDistributor
  (scale.json, "real processes");
* reads: the 2-rank read against the plain pyarrow loop and the peers (data_reader.json,
  "reading"), and in order and shuffled reads of wide tables against the loop, by number
  of columns ("wide N");
* warm-worlds: run 1 and the later runs of kept worlds beside cold runs and Ray on Spark
  (launch_overhead.json, "launch" and "kept");
* scale-curve: the simulator's driver from 16 to 1,024 ranks (scale.json, "simulator");
* recovery: a world shrinking and growing, from a job's trace (recovery-trace.json, the
  format of sparkdist/trace/format.py; `recovery_figure`).

Not a benchmark itself: `make bench` runs it after them.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sparkdist.trace import format as trace_format  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parent.parent / "build" / "bench"
RECOVERY_TRACE = "recovery-trace.json"
PEER = "#c0392b"
"""The peers' colour in every figure (red), against sparkdist's blues and greens."""

STYLE = {
    "svg.fonttype": "none",  # text stays text: a small file, searchable
    "svg.hashsalt": "sparkdist",  # the same data draws the same file
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
"""Every figure's look, set around each drawing (a caller's own settings stay as they were)."""


def styled(draw: Callable) -> Callable:
    """`draw` within STYLE."""

    @functools.wraps(draw)
    def drawn(*args, **kwargs):
        with plt.rc_context(STYLE):
            return draw(*args, **kwargs)

    return drawn


def load(path: Path) -> dict[str, dict]:
    """A benchmark's JSON as {key: table}; a table without a "source" (one measured, not
    transcribed) gets the command that measured it."""
    document = json.loads(Path(path).read_text())
    tables = {}
    for table in document["tables"]:
        table.setdefault("source", f"measured: {document['command']}")
        tables[table["key"]] = table
    return tables


def records(table: dict) -> list[dict]:
    """The table's rows as {column: value}."""
    return [dict(zip(table["columns"], row, strict=True)) for row in table["rows"]]


def column_named(table: dict, prefix: str) -> str:
    """The table's first column whose name starts with `prefix` ("runs 2-" for
    "runs 2-4 median s": the count is the run's --repeat)."""
    return next(name for name in table["columns"] if name.startswith(prefix))


def seconds_axis(axis) -> None:
    """A log axis labelled in plain numbers (0.01, 0.1, 1, 10) rather than powers of ten."""
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def rate_axis(axis) -> None:
    """A log axis of rates labelled 10k, 100k, 1M, 10M."""

    def label(value: float, _) -> str:
        for scale, suffix in ((1e6, "M"), (1e3, "k")):
            if value >= scale:
                return f"{value / scale:g}{suffix}"
        return f"{value:g}"

    axis.set_major_formatter(FuncFormatter(label))
    axis.set_minor_formatter(NullFormatter())


def finish(fig, path: Path, sources: Sequence[str]) -> None:
    """Print where the numbers come from under the plot, and save without a date (the
    same data writes the same file)."""
    text = "; ".join(dict.fromkeys(sources))
    lines = textwrap.wrap("Data: " + text, 170)
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=6.5, color="0.35", va="bottom")
    fig.tight_layout(rect=(0, 0.02 + 0.025 * len(lines), 1, 1))
    metadata = {"Date": None} if path.suffix == ".svg" else {"Software": None}
    fig.savefig(path, metadata=metadata, dpi=150)
    plt.close(fig)


LAUNCH_LINES = (
    ("mpi s", "sparkdist, mpi launcher", "#1f77b4", "o", "-"),
    ("direct s", "sparkdist, direct launcher", "#2ca02c", "s", "-"),
    ("elastic gang s", "sparkdist, elastic gang", "#17becf", "^", "-"),
    ("TorchDistributor s", "pyspark TorchDistributor", PEER, "D", "--"),
)


@styled
def launch_curve(tables: dict[str, dict], path: Path) -> None:
    """Launch time against ranks: each launcher a line, on log-log axes, with a line of
    linear growth from the direct launcher's first point for scale."""
    table = tables["real processes"]
    rows = records(table)
    nps = [row["np"] for row in rows]
    fig, ax = plt.subplots(figsize=(7, 4.4))
    for name, label, colour, marker, style in LAUNCH_LINES:
        points = [(row["np"], row[name]) for row in rows if row.get(name) is not None]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, style, color=colour, marker=marker, label=label)
            above = name in ("TorchDistributor s", "mpi s")
            for x, y in points if name != "elastic gang s" else ():  # too close to direct's
                ax.annotate(
                    f"{y:.3g}",
                    (x, y),
                    textcoords="offset points",
                    xytext=(0, 7 if above else -12),
                    ha="center",
                    fontsize=7,
                    color=colour,
                )
    first = next((row for row in rows if row.get("direct s")), None)
    if first:
        linear = [first["direct s"] * n / first["np"] for n in nps]
        ax.plot(nps, linear, ":", color="0.5", label="linear in np (from direct at the first np)")
    values = [row[n] for row in rows for n, *_ in LAUNCH_LINES if row.get(n) is not None]
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_ylim(min(values) * 0.6, max(values) * 1.6)  # room for the values' labels
    ax.set_xticks(nps, [str(n) for n in nps])
    ax.xaxis.set_minor_formatter(NullFormatter())
    seconds_axis(ax.yaxis)
    ax.set_xlabel("ranks (np)")
    ax.set_ylabel("launch to result, s (median; log scale)")
    ax.set_title("Launch time of a trivial job as the world grows")
    ax.legend(loc="lower right", fontsize=7.5)
    finish(fig, path, [table["source"]])


def reader_colour(label: str) -> str:
    if label.startswith("plain"):
        return "0.55"
    if label.startswith(("sparkdist", "baseline")):
        return "#1f77b4" if "shuffle" not in label else "#ff7f0e"
    return PEER


def two_rank_reads(ax, table: dict) -> None:
    """Each reader's rows/s per rank, one bar a rank (the conversion rows left out)."""
    rows = [row for row in records(table) if row["rank"] is not None and row["rows/s"]]
    labels = list(dict.fromkeys(row["reader"] for row in rows))
    for place, label in enumerate(labels):
        ranks = [row for row in rows if row["reader"] == label]
        for offset, row in enumerate(ranks):
            y = place + (offset - (len(ranks) - 1) / 2) * 0.38
            ax.barh(y, row["rows/s"], height=0.34, color=reader_colour(label))
            ratio = f"  {row['vs loop']:.2f}x" if row.get("vs loop") is not None else ""
            ax.text(row["rows/s"], y, f"{ratio}  rank {row['rank']}", va="center", fontsize=6.5)
    ax.set_yticks(range(len(labels)), [textwrap.fill(label, 30) for label in labels])
    ax.invert_yaxis()
    ax.set_xscale("log")
    rate_axis(ax.xaxis)
    ax.set_xlim(right=ax.get_xlim()[1] * 8)
    ax.set_xlabel("rows/s per rank (log scale; label: x the plain loop)")
    ax.set_title("2 ranks reading at once, against the loop and the peers")


WIDE_LINES = (
    ("sparkdist numpy batches, in order", "in order", "#1f77b4", "o", "-"),
    ("sparkdist numpy batches, shuffle", "shuffle", "#ff7f0e", "s", "--"),
    ("shuffle, workers_count=1", "shuffle, 1 decode thread", "#ff7f0e", "v", ":"),
    ("sparkdist numpy, features= stack, shuffle", "features= stack, shuffle", "#2ca02c", "^", "--"),
    ("array column: sparkdist numpy, shuffle", "one array column, shuffle", "#9467bd", "D", "-."),
)


def wide_reads(ax, tables: list[dict]) -> None:
    """Each reader's rows/s over the plain loop's, against the table's column count."""
    by_count = {int(t["key"].split()[1]): {r["reader"]: r for r in records(t)} for t in tables}
    counts = sorted(by_count)
    for reader, label, colour, marker, style in WIDE_LINES:
        points = [
            (n, by_count[n][reader]["vs loop"])
            for n in counts
            if by_count[n].get(reader, {}).get("vs loop") is not None
        ]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, style, color=colour, marker=marker, label=label)
    ax.axhline(1.0, color="0.45", linewidth=1.5, label="plain pyarrow loop (1.0)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(bottom=0)
    ax.set_xlabel("float32 columns in the table (one rank, numpy batches)")
    ax.set_ylabel("rows/s over the plain loop's (x)")
    ax.set_title("Wide tables: in order and shuffled, against the loop")
    ax.legend(fontsize=7.5)


@styled
def reads(tables: dict[str, dict], path: Path) -> None:
    """The two-rank read beside the peers (left) and the wide tables (right)."""
    wide = [t for key, t in tables.items() if key.startswith("wide ")]
    panels = [p for p in (tables.get("reading"), wide or None) if p]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.8), squeeze=False)
    sources = []
    for ax, panel in zip(axes[0], panels, strict=True):
        if isinstance(panel, list):
            wide_reads(ax, panel)
            sources += [t["source"] for t in panel]
        else:
            two_rank_reads(ax, panel)
            sources.append(panel["source"])
    finish(fig, path, sources)


WARM_BARS = (
    ("setup s", "setup (Ray's cluster)", "#bcbd22"),
    ("run 1 s", "run 1 (starts the world)", "#ff7f0e"),
    ("later s", "runs 2.. (median; cold: every run)", "#1f77b4"),
)


def warm_rows(tables: dict[str, dict]) -> list[dict]:
    """The cold rows of the first table (every run starts a world) then the kept ones, as
    {"launcher", "setup s", "run 1 s", "later s"}."""
    rows = []
    for row in records(tables["launch"]):
        if row["median s"] is not None and not row["launcher"].startswith("Connect"):
            later = row["median s"]
            rows.append({"launcher": f"{row['launcher']} (cold)", "later s": later})
    kept = tables["kept"]
    later = column_named(kept, "runs 2-")
    for row in records(kept):
        rows.append({**row, "later s": row[later]})
    return rows


@styled
def warm_worlds(tables: dict[str, dict], path: Path) -> None:
    """Horizontal bars per launcher: setup, run 1, the later runs' median; log seconds.
    The peers' bars are hatched."""
    rows = warm_rows(tables)
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(rows) + 1.6))
    height = 0.26
    for place, row in enumerate(rows):
        peer = not row["launcher"].startswith("sparkdist")
        bars = [(n, label, c) for n, label, c in WARM_BARS if row.get(n) is not None]
        for offset, (name, _, colour) in enumerate(bars):
            y = place + (offset - (len(bars) - 1) / 2) * height
            ax.barh(y, row[name], height=height * 0.9, color=colour, hatch="///" if peer else None)
            ax.text(row[name], y, f" {row[name]:.3g} s", va="center", fontsize=6.5)
    ax.set_yticks(range(len(rows)), [textwrap.fill(r["launcher"], 44) for r in rows])
    ax.invert_yaxis()
    ax.set_xscale("log")
    seconds_axis(ax.xaxis)
    ax.set_xlim(0.005, ax.get_xlim()[1] * 3)
    handles = [Patch(color=colour, label=label) for _, label, colour in WARM_BARS]
    handles.append(Patch(facecolor="white", edgecolor="0.3", hatch="///", label="a peer"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    ax.set_xlabel("seconds (log scale)")
    ax.set_title("Warm worlds: a trivial 2-rank job, run 1 and the runs after it")
    finish(fig, path, [tables["launch"]["source"], tables["kept"]["source"]])


SCALE_LINES = (
    ("form s", "form the world", "#1f77b4", "o"),
    ("1 MB payload s", "1 MB to every rank", "#2ca02c", "s"),
    ("1,000 lines/rank s", "1,000 lines from every rank", "#ff7f0e", "^"),
    ("collect s", "collect the results", "#9467bd", "D"),
)
PHASE_COLOURS = {"form": "#1f77b4", "lines": "#ff7f0e", "collect": "#9467bd", "payloads": "#2ca02c"}


def simulator_times(ax, table: dict) -> None:
    """Wall seconds of each operation against ranks, log-log, with a linear reference."""
    rows = records(table)
    ranks = [row["ranks"] for row in rows]
    for name, label, colour, marker in SCALE_LINES:
        points = [(row["ranks"], row[name]) for row in rows if row.get(name) is not None]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, "-", color=colour, marker=marker, label=label)
    first = rows[0]
    linear = [first["1,000 lines/rank s"] * n / first["ranks"] for n in ranks]
    ax.plot(ranks, linear, ":", color="0.5", label="linear in ranks")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ranks, [f"{n:,}" for n in ranks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    seconds_axis(ax.yaxis)
    ax.set_xlabel("simulated ranks (8 per host)")
    ax.set_ylabel("wall seconds (log scale)")
    ax.set_title("What each step of a job takes the driver")
    ax.legend(fontsize=7.5)


def simulator_cpu(ax, table: dict, phases: dict | None) -> None:
    """The driver's CPU seconds per world size, by phase where the table has them; its
    thread count over each bar."""
    rows = records(table)
    places = range(len(rows))
    if phases:
        bottom = [0.0] * len(rows)
        by_ranks = {row["ranks"]: row for row in records(phases)}
        for phase, colour in PHASE_COLOURS.items():
            values = [by_ranks[row["ranks"]][f"driver CPU s: {phase}"] for row in rows]
            ax.bar(places, values, bottom=bottom, color=colour, label=phase)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.legend(title="driver CPU by phase", fontsize=7.5)
    else:
        ax.bar(places, [row["driver CPU s"] for row in rows], color="#1f77b4")
    for place, row in zip(places, rows, strict=True):
        note = f"{row['driver CPU s']:g} s\n{row['driver threads']} threads"
        ax.text(place, row["driver CPU s"], note, ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(places), [f"{row['ranks']:,}" for row in rows])
    ax.set_ylim(top=max(row["driver CPU s"] for row in rows) * 1.25)
    ax.set_xlabel("simulated ranks")
    ax.set_ylabel("driver CPU seconds, whole job")
    ax.set_title("The driver's CPU and threads")


@styled
def scale_curve(tables: dict[str, dict], path: Path) -> None:
    """The simulator's curve: wall times (left), the driver's CPU (right)."""
    table = tables["simulator"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    simulator_times(left, table)
    simulator_cpu(right, table, tables.get("simulator cpu by phase"))
    finish(fig, path, [table["source"]])


SPANS = {trace_format.GENERATIONS: "generations", trace_format.JOB: "attempts"}
"""The driver's lanes whose slices shade the world's plot: an in-process elastic world's
generations, or (a job relaunched instead) its attempts."""


def trace_parts(events: list[dict]) -> dict:
    """What the recovery figure draws, from a trace's events (times in seconds): the
    driver's world-size counter, its generations, attempts and world changes, each rank's
    steps and failures, and the processes' names."""
    driver = trace_format.DRIVER
    parts: dict = {"sizes": [], "generations": [], "attempts": [], "changes": [], "failures": []}
    parts["steps"] = {}
    parts["names"], parts["end"] = {}, 0.0
    for event in events:
        ts, pid, ph = event.get("ts", 0) / 1e6, event.get("pid"), event.get("ph")
        parts["end"] = max(parts["end"], ts + event.get("dur", 0) / 1e6)
        if ph == "M" and event.get("name") == "process_name":
            parts["names"][pid] = event["args"]["name"]
        elif ph == "C" and pid == driver and event.get("name") == "world size":
            parts["sizes"].append((ts, event["args"]["ranks"]))
        elif ph == "X" and pid == driver and event.get("tid") in SPANS:
            span = (ts, event["dur"] / 1e6, event["name"])
            parts[SPANS[event["tid"]]].append(span)
        elif ph == "i" and pid == driver and event.get("name") == "world change":
            parts["changes"].append(ts)
        elif ph == "X" and pid != driver and event.get("tid") == trace_format.STEPS:
            parts["steps"].setdefault(pid, []).append((ts, event["dur"] / 1e6))
        elif ph == "i" and pid != driver and event.get("name") == "failure":
            parts["failures"].append((ts, pid))
    parts["sizes"].sort()
    return parts


def draw_world(ax, parts: dict) -> None:
    """The world size as a step line, the generations (else the attempts) as shaded spans,
    the world changes as dashed lines."""
    shades = ("#dbe9f6", "#fde3c8")
    spans = parts["generations"] or parts["attempts"]
    for index, (start, length, name) in enumerate(sorted(spans)):
        ax.axvspan(start, start + length, color=shades[index % 2], zorder=0)
        middle = start + length / 2
        ax.text(middle, 1.02, name, transform=ax.get_xaxis_transform(), ha="center", fontsize=7)
    if parts["sizes"]:
        times = [t for t, _ in parts["sizes"]] + [parts["end"]]
        sizes = [s for _, s in parts["sizes"]]
        ax.step(times, sizes + sizes[-1:], where="post", color="#1f77b4", linewidth=2)
        ax.set_ylim(0, max(sizes) + 1)
        ax.set_yticks(range(0, max(sizes) + 1))
    for change in parts["changes"]:
        ax.axvline(change, color="#c0392b", linestyle="--", linewidth=1)
    ax.set_ylabel("world size\n(ranks)")
    ax.grid(axis="x", alpha=0)


def draw_ranks(ax, parts: dict) -> None:
    """A row per rank: its steps as bars (alternate shades tell neighbours apart), its
    failures as red crosses; the world changes as dashed lines."""
    pids = sorted(set(parts["steps"]) | {pid for _, pid in parts["failures"]})
    row_of = {pid: row for row, pid in enumerate(pids)}
    for pid in pids:
        steps = sorted(parts["steps"].get(pid, []))
        for shade in (0, 1):
            bars = steps[shade::2]
            ax.broken_barh(bars, (row_of[pid] - 0.35, 0.7), color=("#4c72b0", "#8fb0d9")[shade])
    for ts, pid in parts["failures"]:
        ax.plot(ts, row_of[pid], "x", color="#c0392b", markersize=9, markeredgewidth=2)
    for change in parts["changes"]:
        ax.axvline(change, color="#c0392b", linestyle="--", linewidth=1)
    labels = [parts["names"].get(pid, f"rank {trace_format.pid_rank(pid)}") for pid in pids]
    ax.set_yticks(range(len(pids)), labels)
    ax.set_ylim(len(pids) - 0.5, -0.5)
    ax.set_xlabel("seconds since the job started (the driver's clock)")
    ax.grid(axis="y", alpha=0)


@styled
def recovery_figure(trace_path: Path, out_path: Path) -> None:
    """A world shrinking and growing, from a job's trace (sparkdist/trace/format.py): the
    driver's "world size" counter as a step line over the generations' slices, world
    changes as dashed lines, and a row of step slices per rank, failures marked."""
    document = json.loads(Path(trace_path).read_text())
    parts = trace_parts(document["traceEvents"])
    ranks = max(len(set(parts["steps"]) | {pid for _, pid in parts["failures"]}), 1)
    fig, (top, bottom) = plt.subplots(
        2,
        1,
        sharex=True,
        figsize=(10.5, 2.4 + 0.32 * ranks),
        gridspec_kw={"height_ratios": [1.1, max(1.0, 0.3 * ranks)]},
    )
    draw_world(top, parts)
    draw_ranks(bottom, parts)
    job = document.get("otherData", {}).get("sparkdist", {}).get("name")
    title = "Recovery: the world shrinks and grows" + (f" ({job})" if job else "")
    top.set_title(title, pad=14)
    handles = [
        Line2D([], [], color="#1f77b4", linewidth=2, label="world size (the driver's counter)"),
        Line2D([], [], color="#c0392b", linestyle="--", label="world change"),
        Line2D([], [], color="#c0392b", marker="x", linestyle="", label="failure"),
        Patch(color="#4c72b0", label="a rank's steps (shades alternate)"),
    ]
    top.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5)
    finish(fig, out_path, [f"the job's trace, {Path(trace_path).name}"])


FIGURES: tuple[tuple[str, str, tuple[str, ...], Callable], ...] = (
    ("launch-curve", "scale.json", ("real processes",), launch_curve),
    ("reads", "data_reader.json", (), reads),
    ("warm-worlds", "launch_overhead.json", ("launch", "kept"), warm_worlds),
    ("scale-curve", "scale.json", ("simulator",), scale_curve),
)


def draw_all(data: Path, out: Path, suffix: str = ".svg") -> list[Path]:
    """Every figure whose data is in `data`, into `out`; says which it skipped and why."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, source, needed, draw in FIGURES:
        path = data / source
        tables = load(path) if path.exists() else {}
        missing = [key for key in needed if key not in tables]
        if name == "reads" and not any(k == "reading" or k.startswith("wide ") for k in tables):
            missing = ["reading", "wide N"]
        if not path.exists() or missing:
            why = f"no {path}" if not path.exists() else f"no table {missing} in {path}"
            print(f"{name}: skipped ({why})")
            continue
        draw(tables, out / f"{name}{suffix}")
        written.append(out / f"{name}{suffix}")
    trace = data / RECOVERY_TRACE
    if trace.exists():
        recovery_figure(trace, out / f"recovery{suffix}")
        written.append(out / f"recovery{suffix}")
    else:
        print(f"recovery: skipped (no {trace}: a job's trace.json with a world change)")
    for path in written:
        print(f"wrote {path}")
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the benchmarks' JSON")
    parser.add_argument("--out", type=Path, default=None, help="default: DATA/figures")
    parser.add_argument("--format", choices=("svg", "png"), default="svg")
    args = parser.parse_args()
    draw_all(args.data, args.out or args.data / "figures", f".{args.format}")


if __name__ == "__main__":
    main()
