"""A job's trace as a picture: a row per rank, the slowest marked, failures and world
changes marked, data-wait share, mean step and peak GPU memory per rank.

`Timeline(trace)` reads a parsed trace.json (`format.py`); it shows itself in Jupyter and
Databricks (`_repr_html_`: an SVG, no JavaScript, no network, generic fonts), and writes
the trace (`save`), a standalone page (`save_html`) and a PNG (`to_png`, matplotlib).
"""

from __future__ import annotations

import html
import json
import logging
import math
import os
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sparkdist.trace import format, validate

log = logging.getLogger(__name__)

US = 1e6  # microseconds in a second: trace times are microseconds


@dataclass(frozen=True)
class RankSummary:
    """What the picture's columns say of one rank."""

    rank: int
    host: str
    steps: int
    mean_step_s: float | None
    busy_s: float
    """How long its `main` ran (or, without one, from its first slice to its last)."""
    data_wait_s: float
    data_wait_share: float | None
    """`data_wait_s` over `main`'s time; None when `main` never started."""
    failures: tuple[str, ...]
    """The reasons of its "failure" instants."""
    peak_gpu_mib: float | None
    """The most GPU memory allocated; None where it had no GPU (no counter)."""
    gpu_percent: float | None = None
    """Its GPU's mean utilisation (NVML's samples); None without NVML or a GPU."""


@dataclass(frozen=True)
class WorldChange:
    """A change of an elastic world: when (seconds since the job started), its new size."""

    t_s: float
    size: int | None
    why: str


class Timeline:
    """A finished (or running) job's trace, summarised per rank and drawn."""

    def __init__(self, trace: dict) -> None:
        if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
            raise ValueError("not a trace: expected an object with a `traceEvents` list")
        found = validate.problems(trace)
        if found:  # drawn all the same: a picture of a flawed trace is still worth seeing
            log.warning("the trace has %d problem(s), the first: %s", len(found), found[0])
        self.trace = trace
        self._slices: dict[tuple[int, int], list[dict]] = defaultdict(list)
        self._instants: dict[int, list[dict]] = defaultdict(list)
        self._counters: dict[tuple[int, str], list[dict]] = defaultdict(list)
        self._process_names: dict[int, str] = {}
        for event in trace["traceEvents"]:
            self._add(event)
        self.ranks = [self._summary(rank) for rank in self._rank_numbers()]

    @classmethod
    def load(cls, path: str | os.PathLike) -> Timeline:
        """From a trace.json, or from a job's directory that holds one."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, format.FILE_NAME)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no trace at {path}")
        with open(path, encoding="utf-8") as file:
            return cls(json.load(file))

    def _add(self, event: Any) -> None:
        if not isinstance(event, dict) or not isinstance(event.get("pid"), int):
            return
        pid, ph = event["pid"], event.get("ph")
        if ph != "M" and not validate.is_number(event.get("ts")):
            return  # validate.problems named it; nothing to place in time
        if ph == "X" and validate.is_number(event.get("dur")):
            self._slices[pid, event.get("tid")].append(event)
        elif ph == "i":
            self._instants[pid].append(event)
        elif ph == "C" and isinstance(event.get("args"), dict):
            self._counters[pid, event.get("name")].append(event)
        elif ph == "M" and event.get("name") == "process_name":
            self._process_names[pid] = str((event.get("args") or {}).get("name", ""))

    def _rank_numbers(self) -> list[int]:
        pids = set(self._process_names) | set(self._instants)
        pids |= {pid for pid, _ in self._slices} | {pid for pid, _ in self._counters}
        return sorted(format.pid_rank(pid) for pid in pids if pid != format.DRIVER)

    # --- what the picture says ------------------------------------------------------------

    @property
    def info(self) -> dict:
        """The job's own record: `otherData.sparkdist` (name, np, outcome ...)."""
        other = self.trace.get("otherData")
        ours = other.get("sparkdist") if isinstance(other, dict) else None
        return ours if isinstance(ours, dict) else {}

    @property
    def slowest_rank(self) -> int | None:
        """The rank whose mean step is longest; None when no rank reported a step."""
        timed = [r for r in self.ranks if r.mean_step_s is not None]
        return max(timed, key=lambda r: r.mean_step_s).rank if timed else None

    @property
    def world_changes(self) -> list[WorldChange]:
        """The driver's "world change" instants, each with the world's new size (its
        `args["ranks"]`, else the "world size" counter's value at that time)."""
        sizes = self.world_sizes
        changes = []
        for event in self.instants(format.DRIVER, "world change"):
            args = event.get("args") or {}
            size = args.get("ranks")
            size = len(size) if isinstance(size, list) else size
            if not isinstance(size, int):
                before = [n for t, n in sizes if t <= event["ts"] / US]
                size = before[-1] if before else None
            changes.append(WorldChange(event["ts"] / US, size, str(args.get("why", ""))))
        return changes

    @property
    def world_sizes(self) -> list[tuple[float, int]]:
        """The "world size" counter: (seconds, ranks), in time order."""
        samples = sorted(self._counters[format.DRIVER, "world size"], key=lambda e: e["ts"])
        return [(e["ts"] / US, int(e["args"].get("ranks", 0))) for e in samples]

    @property
    def end_s(self) -> float:
        """When the last thing in the trace ended, in seconds since the job started."""
        ends = [e["ts"] + e["dur"] for lane in self._slices.values() for e in lane]
        ends += [e["ts"] for lane in self._instants.values() for e in lane]
        ends += [e["ts"] for lane in self._counters.values() for e in lane]
        return max([end for end in ends if isinstance(end, (int, float))] or [0]) / US

    def slices(self, pid: int, lane: int) -> list[dict]:
        """The `X` events of one lane, by start."""
        return sorted(self._slices.get((pid, lane), []), key=lambda e: e["ts"])

    def instants(self, pid: int, name: str | None = None) -> list[dict]:
        """A process's instants (of kind `name` if given), by time."""
        found = [e for e in self._instants.get(pid, []) if name in (None, e.get("name"))]
        return sorted(found, key=lambda e: e.get("ts", 0))

    def _summary(self, rank: int) -> RankSummary:
        pid = format.rank_pid(rank)
        steps = self.slices(pid, format.STEPS)
        step_count = sum(int((e.get("args") or {}).get("steps", 1)) for e in steps)
        step_us = sum(e["dur"] for e in steps)
        mains = [e for e in self.slices(pid, format.LAUNCH) if e.get("name") == "main"]
        main_us = sum(e["dur"] for e in mains)
        wait_us = sum(e["dur"] for e in self.slices(pid, format.DATA_WAIT))
        everything = [e for (p, _), lane in self._slices.items() if p == pid for e in lane]
        span_us = (
            max(e["ts"] + e["dur"] for e in everything) - min(e["ts"] for e in everything)
            if everything
            else 0
        )
        memory = [e["args"].get("allocated_mib") for e in self._counters[pid, "gpu memory"]]
        memory = [m for m in memory if isinstance(m, (int, float))]
        used = [e["args"].get("percent") for e in self._counters[pid, "gpu utilisation"]]
        used = [u for u in used if isinstance(u, (int, float))]
        return RankSummary(
            rank=rank,
            host=_host(self._process_names.get(pid, "")),
            steps=step_count,
            mean_step_s=step_us / step_count / US if step_count else None,
            busy_s=(main_us if mains else span_us) / US,
            data_wait_s=wait_us / US,
            data_wait_share=wait_us / main_us if main_us else None,
            failures=tuple(
                str((e.get("args") or {}).get("reason", "")) for e in self.instants(pid, "failure")
            ),
            peak_gpu_mib=max(memory) if memory else None,
            gpu_percent=sum(used) / len(used) if used else None,
        )

    # --- outputs --------------------------------------------------------------------------

    def svg(self) -> str:
        """The picture as a standalone SVG document."""
        return _svg(self, standalone=True)

    def _repr_html_(self) -> str:
        """What Jupyter and Databricks' displayHTML show: the SVG in a small fragment."""
        caption = html.escape(_title(self))
        return (
            f'<div class="sparkdist-timeline" title="{caption}" '
            'style="max-width:100%;overflow-x:auto">'
            f"{_svg(self, standalone=False)}</div>"
        )

    def to_html(self) -> str:
        """A whole standalone page: the picture and nothing that loads anything."""
        return (
            '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f"<title>{html.escape(_title(self))}</title>\n"
            "<style>body{margin:16px;background:#fff;font-family:sans-serif}</style>\n"
            f"</head>\n<body>\n{self._repr_html_()}\n</body>\n</html>\n"
        )

    def save(self, path: str | os.PathLike) -> str:
        """Write the trace JSON (Perfetto's UI and chrome://tracing open it); its path."""
        with open(path, "w", encoding="utf-8") as file:
            json.dump(self.trace, file)
        return os.fspath(path)

    def save_html(self, path: str | os.PathLike) -> str:
        """Write `to_html()`; its path."""
        with open(path, "w", encoding="utf-8") as file:
            file.write(self.to_html())
        return os.fspath(path)

    def to_png(self, path: str | os.PathLike) -> str:
        """Draw the picture with matplotlib (Agg) into a PNG; its path."""
        _png(self, os.fspath(path))
        return os.fspath(path)


def _host(process_name: str) -> str:
    """The host of a rank's process name, "rank 3 (host)"."""
    found = re.search(r"\((.*)\)\s*$", process_name)
    return found.group(1) if found else ""


def _title(timeline: Timeline) -> str:
    """The picture's one-line caption: the job, its ranks, outcome and length."""
    info = timeline.info
    parts = [f"sparkdist job {info.get('name') or info.get('job_id') or ''}".rstrip()]
    parts.append(f"{len(timeline.ranks)} ranks")
    if info.get("outcome"):
        parts.append(str(info["outcome"]))
    parts.append(f"{timeline.end_s:.3g} s")
    return " · ".join(parts)


# --- the SVG: a row per rank, drawn with plain shapes, a <title> on each for its tooltip ----

WIDTH = 1200
LABEL_W = 190
"""The rank labels' column, left of the time axis."""
COLUMNS = ("data wait", "mean step", "GPU peak")
COLUMN_W = 84
PLOT_X = LABEL_W
PLOT_W = WIDTH - LABEL_W - 16 - COLUMN_W * len(COLUMNS)
TOP = 70
"""Where the first row starts: the title, the columns' heads and the time axis above it."""
ROW_H, ROW_GAP, TAB_W = 40, 6, 6
MIN_PX = 2.0
"""Slices narrower than this merge with their neighbours into one shape, so that a long
job's picture stays small (at most a shape per couple of pixels per lane)."""
FONT = "sans-serif"

COLOURS = {
    "scheduled": "#bdbdbd",
    "starting": "#9ecae1",
    "loading": "#4292c6",
    "main": "#c7e9c0",
    "step": "#3b6fb6",
    "step alt": "#86a9d9",
    "data wait": "#f28e2b",
    "checkpoint": "#8e6bbf",
    "stall": "#555555",
    "failure": "#d62728",
    "notice": "#e6a700",
    "stacks": "#222222",
    "world change": "#2ca02c",
    "attempt": "#9e9ac8",
    "generation": "#bcbddc",
    "row": "#f3f6fa",
    "slowest row": "#fde8e4",
    "tab": "#34495e",
    "slowest tab": "#c0392b",
}
"""Each thing's colour; a row's tab (its left edge) is `tab`, the slowest rank's
`slowest tab`: the tests count rows in a screenshot by these."""


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _attribute(keyword: str) -> str:
    """An SVG attribute's name from a keyword: `class_` is class, `font_size` font-size."""
    return keyword.rstrip("_").replace("_", "-")


def _rect(x: float, y: float, w: float, h: float, fill: str, tip: str = "", **attrs: str) -> str:
    extra = "".join(f' {_attribute(key)}="{_esc(value)}"' for key, value in attrs.items())
    shape = f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" height="{h:.1f}" fill="{fill}"'
    if not tip:
        return f"{shape}{extra}/>"
    return f"{shape}{extra}><title>{_esc(tip)}</title></rect>"


def _text(x: float, y: float, text: Any, size: int = 11, **attrs: str) -> str:
    extra = "".join(f' {_attribute(key)}="{_esc(value)}"' for key, value in attrs.items())
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-family="{FONT}" font-size="{size}"{extra}>'
        f"{_esc(text)}</text>"
    )


class _Scale:
    """Trace time (microseconds) to the picture's x."""

    def __init__(self, end_s: float) -> None:
        self.end_us = max(end_s * US, 1.0)

    def x(self, ts_us: float) -> float:
        return PLOT_X + min(max(ts_us, 0.0), self.end_us) / self.end_us * PLOT_W


def _svg(timeline: Timeline, standalone: bool) -> str:
    """The whole picture. `standalone`: an SVG document (with its namespace); otherwise
    the element alone, for HTML (which needs no namespace, and so holds no URL at all)."""
    scale = _Scale(timeline.end_s)
    driver = _has_driver_row(timeline)
    rows_top = TOP + (ROW_H + ROW_GAP if driver else 0)
    rows_bottom = rows_top + len(timeline.ranks) * (ROW_H + ROW_GAP)
    height = rows_bottom + 56
    namespace = ' xmlns="http://www.w3.org/2000/svg"' if standalone else ""
    parts = [
        f'<svg{namespace} width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" '
        f'role="img" aria-label="{_esc(_title(timeline))}">',
        _rect(0, 0, WIDTH, height, "#ffffff"),
        _text(TAB_W, 18, _title(timeline), size=14, font_weight="bold"),
    ]
    parts += _svg_heads(scale, rows_bottom)
    if driver:
        parts += _svg_driver_row(timeline, scale, TOP)
    slowest = timeline.slowest_rank if _timed_ranks(timeline) > 1 else None
    for index, summary in enumerate(timeline.ranks):
        y = rows_top + index * (ROW_H + ROW_GAP)
        parts += _svg_rank_row(timeline, summary, scale, y, summary.rank == slowest)
    parts += _svg_world_changes(timeline, scale, TOP - 4, rows_bottom)
    parts += _svg_legend(rows_bottom + 36)
    parts.append("</svg>")
    return "\n".join(parts)


def _timed_ranks(timeline: Timeline) -> int:
    """How many ranks reported steps: the slowest is marked only among two or more."""
    return sum(1 for summary in timeline.ranks if summary.mean_step_s is not None)


def _has_driver_row(timeline: Timeline) -> bool:
    lanes = (format.JOB, format.GENERATIONS, format.STALLS)
    return any(timeline.slices(format.DRIVER, lane) for lane in lanes)


def _ticks(end_s: float) -> list[float]:
    """Round times for the axis: about eight, at 1, 2 or 5 times a power of ten."""
    end_s = max(end_s, 1e-3)
    raw = end_s / 8
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(int(end_s / step) + 1)]


def _svg_heads(scale: _Scale, rows_bottom: float) -> list[str]:
    """The columns' heads, the time axis and its grid."""
    parts = []
    for index, head in enumerate(COLUMNS):
        x = PLOT_X + PLOT_W + 16 + index * COLUMN_W + COLUMN_W / 2
        parts.append(_text(x, TOP - 24, head, text_anchor="middle", font_weight="bold"))
    parts.append(_text(TAB_W, TOP - 24, "rank (host)", font_weight="bold"))
    for tick in _ticks(scale.end_us / US):
        x = scale.x(tick * US)
        parts.append(_text(x, TOP - 8, f"{tick:g} s", size=10, text_anchor="middle"))
        parts.append(
            f'<line x1="{x:.1f}" y1="{TOP - 4}" x2="{x:.1f}" y2="{rows_bottom:.1f}" '
            'stroke="#000000" stroke-opacity="0.08"/>'
        )
    return parts


def _svg_bars(
    scale: _Scale,
    events: list[dict],
    top: float,
    height: float,
    fills: tuple[str, ...],
    dense: bool = False,
) -> list[str]:
    """A lane's slices as rectangles, alternating `fills`; those narrower than `MIN_PX`
    merge with their near neighbours into one, whose tooltip counts them. `dense` (a lane
    whose share of time counts: the data waits): a merged shape is as opaque as the time
    its slices hold fills it, so a thousand waits of a millisecond stay faint."""
    parts: list[str] = []
    run: list[Any] = []  # [x0, x1, slices, seconds] of the narrow ones being merged

    def flush() -> None:
        if run:
            tip = f"{run[2]} slices, {run[3]:.3g} s in all"
            width = max(run[1] - run[0], 1.0)
            held = run[3] * US / scale.end_us * PLOT_W  # the pixels its time would fill
            faint = {}
            if dense and held < width:
                faint["fill_opacity"] = f"{max(held / width, 0.15):.2f}"
            parts.append(_rect(run[0], top, width, height, fills[0], tip, **faint))
            run.clear()

    for index, event in enumerate(events):
        x0, x1 = scale.x(event["ts"]), scale.x(event["ts"] + event["dur"])
        seconds = event["dur"] / US
        if x1 - x0 >= MIN_PX:
            flush()
            tip = f"{event.get('name', '')}: {seconds:.3g} s"
            fill = fills[index % len(fills)]
            parts.append(_rect(x0, top, x1 - x0, height, fill, tip, stroke="#ffffff"))
        elif run and x0 - run[1] < MIN_PX:
            run[1], run[2], run[3] = max(run[1], x1), run[2] + 1, run[3] + seconds
        else:
            flush()
            run.extend([x0, x1, 1, seconds])
    flush()
    return parts


def _svg_rank_row(
    timeline: Timeline, summary: RankSummary, scale: _Scale, y: float, slowest: bool
) -> list[str]:
    """One rank: its tab and label, its lanes, its marks, its columns."""
    pid = format.rank_pid(summary.rank)
    row, tab = ("slowest row", "slowest tab") if slowest else ("row", "tab")
    parts = [
        f'<g class="rank-row{" slowest" if slowest else ""}" data-rank="{summary.rank}">',
        _rect(0, y, WIDTH, ROW_H, COLOURS[row]),
        _rect(0, y, TAB_W, ROW_H, COLOURS[tab], class_="row-tab"),
        _text(TAB_W + 8, y + 16, f"rank {summary.rank}", size=12, font_weight="bold"),
        _text(TAB_W + 8, y + 31, summary.host, size=10, fill="#555555"),
    ]
    if slowest:
        parts.append(
            _text(TAB_W + 62, y + 16, "slowest", size=11, font_weight="bold", fill=COLOURS[tab])
        )
    parts += _svg_lanes(timeline, pid, scale, y)
    parts += _svg_marks(timeline, pid, scale, y)
    parts += _svg_columns(summary, y)
    parts.append("</g>")
    return parts


def _svg_lanes(timeline: Timeline, pid: int, scale: _Scale, y: float) -> list[str]:
    """Launch phases on top, then steps, data waits, checkpoints; stalls over the row."""
    parts = []
    for event in timeline.slices(pid, format.LAUNCH):
        name = event.get("name", "")
        x0, x1 = scale.x(event["ts"]), scale.x(event["ts"] + event["dur"])
        fill = COLOURS.get(name, COLOURS["scheduled"])
        tip = f"{name}: {event['dur'] / US:.3g} s"
        parts.append(_rect(x0, y + 3, max(x1 - x0, 1.0), 6, fill, tip, class_="phase"))
    steps = timeline.slices(pid, format.STEPS)
    parts += _svg_bars(scale, steps, y + 11, 14, (COLOURS["step"], COLOURS["step alt"]))
    waits = timeline.slices(pid, format.DATA_WAIT)
    parts += _svg_bars(scale, waits, y + 27, 6, (COLOURS["data wait"],), dense=True)
    saves = timeline.slices(pid, format.CHECKPOINT)
    parts += _svg_bars(scale, saves, y + 34, 5, (COLOURS["checkpoint"],))
    for event in timeline.slices(pid, format.STALLS):
        x0, x1 = scale.x(event["ts"]), scale.x(event["ts"] + event["dur"])
        tip = f"{event.get('name', 'stall')}: {event['dur'] / US:.3g} s without a sign of life"
        width = max(x1 - x0, 2.0)
        parts.append(
            _rect(x0, y, width, ROW_H, COLOURS["stall"], tip, class_="stall", fill_opacity="0.3")
        )
    return parts


def _svg_marks(timeline: Timeline, pid: int, scale: _Scale, y: float) -> list[str]:
    """Instants: a failure as a red line through the row with a flag, a notice or a
    stacks dump as a small diamond; each with its reason in a tooltip."""
    parts = []
    for event in timeline.instants(pid):
        name, args = event.get("name", ""), event.get("args") or {}
        x = scale.x(event.get("ts", 0))
        detail = args.get("reason") or args.get("why") or ""
        tip = f"{name} at {event.get('ts', 0) / US:.3g} s" + (f": {detail}" if detail else "")
        colour = COLOURS.get(name, COLOURS["stacks"])
        if name == "failure":
            parts.append(
                f'<g class="failure"><title>{_esc(tip)}</title>'
                f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{x:.1f}" y2="{y + ROW_H:.1f}" '
                f'stroke="{colour}" stroke-width="2"/>'
                f'<path d="M{x:.1f},{y + 1:.1f} l10,5 l-10,5 z" fill="{colour}"/></g>'
            )
        elif name in ("notice", "stacks"):
            parts.append(
                f'<path class="{_esc(name)}" d="M{x:.1f},{y + 26:.1f} l4,4 l-4,4 l-4,-4 z" '
                f'fill="{colour}"><title>{_esc(tip)}</title></path>'
            )
    return parts


def _column_values(summary: RankSummary) -> tuple[str, str, str]:
    share = summary.data_wait_share
    return (
        "-" if share is None else f"{share:.0%}",
        "-" if summary.mean_step_s is None else f"{summary.mean_step_s:.3g} s",
        _gpu(summary),
    )


def _gpu(summary: RankSummary) -> str:
    """Peak memory, and the mean utilisation where NVML gave one: "512 MiB · 87%"."""
    if summary.peak_gpu_mib is None:
        return "-"
    text = f"{summary.peak_gpu_mib:,.0f} MiB"
    return text if summary.gpu_percent is None else f"{text} · {summary.gpu_percent:.0f}%"


def _svg_columns(summary: RankSummary, y: float) -> list[str]:
    parts = []
    for index, value in enumerate(_column_values(summary)):
        x = PLOT_X + PLOT_W + 16 + index * COLUMN_W + COLUMN_W / 2
        parts.append(_text(x, y + 24, value, size=12, text_anchor="middle"))
    if summary.failures:
        tip = "failed: " + "; ".join(summary.failures)
        parts.append(f"<title>{_esc(tip)}</title>")
    return parts


def _svg_driver_row(timeline: Timeline, scale: _Scale, y: float) -> list[str]:
    """The driver: its attempts (relaunches), an elastic world's generations, stalls."""
    pid = format.DRIVER
    parts = [
        '<g class="driver-row">',
        _rect(0, y, WIDTH, ROW_H, "#f7f7f7"),
        _text(TAB_W + 8, y + 16, "driver", size=12, font_weight="bold"),
    ]
    attempts = timeline.slices(pid, format.JOB)
    parts += _svg_bars(scale, attempts, y + 4, 14, (COLOURS["attempt"], "#807dba"))
    generations = timeline.slices(pid, format.GENERATIONS)
    parts += _svg_bars(scale, generations, y + 21, 14, (COLOURS["generation"], "#9e9ac8"))
    for event, top in [(e, y + 4) for e in attempts] + [(e, y + 21) for e in generations]:
        x0, x1 = scale.x(event["ts"]), scale.x(event["ts"] + event["dur"])
        name = _driver_label(event, x1 - x0, px_per_char=6.0)
        if name:
            parts.append(_text((x0 + x1) / 2, top + 11, name, size=10, text_anchor="middle"))
    stalls = timeline.slices(pid, format.STALLS)
    parts += _svg_bars(scale, stalls, y, 3, (COLOURS["stall"],))
    parts.append("</g>")
    return parts


def _driver_label(event: dict, width_px: float, px_per_char: float) -> str:
    """The longest name of a driver's slice that fits in its bar: "generation 1 · 2 ranks",
    "2 ranks", "attempt 1"; "" when none does."""
    name, size = event.get("name", ""), (event.get("args") or {}).get("ranks")
    names = [f"{name} · {size} ranks", f"{size} ranks"] if isinstance(size, int) else [name]
    return next((n for n in names if px_per_char * len(n) + 8 < width_px), "")


def _svg_world_changes(timeline: Timeline, scale: _Scale, top: float, bottom: float) -> list[str]:
    """A vertical line through every row at each world change, with the new size."""
    parts = []
    colour = COLOURS["world change"]
    for change in timeline.world_changes:
        x = scale.x(change.t_s * US)
        size = "?" if change.size is None else change.size
        tip = f"world change at {change.t_s:.3g} s: {size} ranks" + (
            f" ({change.why})" if change.why else ""
        )
        parts.append(
            f'<g class="world-change" data-size="{_esc(size)}"><title>{_esc(tip)}</title>'
            f'<line x1="{x:.1f}" y1="{top:.1f}" x2="{x:.1f}" y2="{bottom:.1f}" '
            f'stroke="{colour}" stroke-width="2" stroke-dasharray="5,3"/>'
            + _text(x + 3, bottom + 12, f"world {size}", size=10, fill=colour)
            + "</g>"
        )
    return parts


LEGEND = (
    ("scheduled", "scheduled"),
    ("starting", "starting"),
    ("loading", "loading"),
    ("main", "main"),
    ("step", "steps"),
    ("data wait", "data wait"),
    ("checkpoint", "checkpoint"),
    ("stall", "stall"),
    ("failure", "failure"),
    ("world change", "world change"),
)
"""The legend's entries, (colour, label): the SVG's and the PNG's."""


def _svg_legend(y: float) -> list[str]:
    parts, x = ['<g class="legend">'], float(PLOT_X)
    for key, label in LEGEND:
        parts.append(_rect(x, y - 9, 10, 10, COLOURS[key]))
        parts.append(_text(x + 14, y, label, size=10))
        x += 24 + 6.2 * len(label)
    parts.append("</g>")
    return parts


# --- the PNG: the same picture with matplotlib, without touching pyplot's global state -----

PNG_W_IN, PNG_DPI = 12.0, 100
PNG_ROW_IN, PNG_TOP_IN, PNG_BOTTOM_IN = 0.5, 0.5, 0.95
"""Each row's height, the title's band above the rows, and below them the time axis and the
legend (inches): a row per rank whatever their number."""
PNG_PLOT_RIGHT = 0.74
PNG_COLUMN_X = (0.765, 0.855, 0.945)
"""Where the plot ends and the columns' centres stand, as fractions of the width."""
PNG_LABEL_PAD_PX = 16


def _png(timeline: Timeline, path: str) -> None:
    """Rows per rank (rank 0 on top; the driver's attempts and generations above them when
    it has any), the same lanes and marks as the SVG, the slowest rank's row tinted and its
    label red, the columns on the right, a legend under the time axis. The left margin
    fits the longest label."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    first = 1 if _has_driver_row(timeline) else 0  # the ranks' first row
    rows = max(first + len(timeline.ranks), 1)
    height = PNG_TOP_IN + PNG_ROW_IN * rows + PNG_BOTTOM_IN
    figure = Figure(figsize=(PNG_W_IN, height), dpi=PNG_DPI)
    canvas = FigureCanvasAgg(figure)
    bottom, plot_h = PNG_BOTTOM_IN / height, PNG_ROW_IN * rows / height
    axes = figure.add_axes((0.18, bottom, PNG_PLOT_RIGHT - 0.18, plot_h))
    axes.set_xlim(0, max(timeline.end_s, 1e-3))
    axes.set_ylim(-0.5, rows - 0.5)
    axes.invert_yaxis()
    axes.set_xlabel("seconds since the job started")
    axes.set_title(_title(timeline), fontsize=11, loc="left", pad=14)
    slowest = timeline.slowest_rank if _timed_ranks(timeline) > 1 else None
    labels = ["driver"] if first else []
    if first:
        _png_driver(axes, timeline)
    for index, summary in enumerate(timeline.ranks):
        is_slowest = summary.rank == slowest
        _png_row(axes, timeline, summary, first + index, is_slowest)
        host = f" ({summary.host})" if summary.host else ""
        labels.append(f"rank {summary.rank}{host}" + ("  slowest" if is_slowest else ""))
    axes.set_yticks(range(len(labels)), labels)
    for label, text in zip(axes.get_yticklabels(), labels, strict=True):
        if text.endswith("slowest"):
            label.set_color(COLOURS["slowest tab"])
            label.set_fontweight("bold")
    _png_world_changes(axes, timeline)
    _png_columns(figure, axes, timeline, first)
    _png_legend(figure)
    _png_fit_labels(canvas, axes)
    figure.savefig(path, format="png")


def _png_world_changes(axes: Any, timeline: Timeline) -> None:
    """A dashed line through the rows at each world change, its new size over the rows
    (left of the line near the end, clear of the columns)."""
    end_s = max(timeline.end_s, 1e-3)
    for change in timeline.world_changes:
        axes.axvline(change.t_s, color=COLOURS["world change"], linestyle="--", linewidth=1.5)
        size = "?" if change.size is None else change.size
        late = change.t_s > 0.85 * end_s  # its label left of the line, clear of the columns
        text = f"world {size} " if late else f" world {size}"
        axes.text(
            change.t_s,
            -0.5,
            text,
            color=COLOURS["world change"],
            fontsize=8,
            ha="right" if late else "left",
        )  # over the rows, under the title


def _png_fit_labels(canvas: Any, axes: Any) -> None:
    """Move the plot's left edge so that the longest row label fits left of it."""
    renderer = canvas.get_renderer()
    labels = axes.get_yticklabels()
    widest = max((label.get_window_extent(renderer).width for label in labels), default=0.0)
    left = min(max((widest + PNG_LABEL_PAD_PX) / (PNG_W_IN * PNG_DPI), 0.06), 0.4)
    bottom, height = axes.get_position().y0, axes.get_position().height
    axes.set_position((left, bottom, PNG_PLOT_RIGHT - left, height))


def _png_bars(
    axes: Any, events: list[dict], row: float, top: float, height: float, colour: Any
) -> None:
    spans = [(e["ts"] / US, e["dur"] / US) for e in events]
    if spans:
        axes.broken_barh(
            spans, (row - 0.5 + top, height), facecolors=colour, edgecolors="white", linewidth=0.3
        )


def _png_driver(axes: Any, timeline: Timeline) -> None:
    """The driver's row: its attempts above its generations, each named where it fits."""
    pid = format.DRIVER
    axes.axhspan(-0.5, 0.5, color="#f7f7f7", zorder=0)
    lanes = (
        (format.JOB, 0.08, (COLOURS["attempt"], "#807dba")),
        (format.GENERATIONS, 0.5, (COLOURS["generation"], "#9e9ac8")),
    )
    per_s = PNG_W_IN * PNG_DPI * (PNG_PLOT_RIGHT - 0.2) / max(timeline.end_s, 1e-3)
    for lane, top, fills in lanes:
        events = timeline.slices(pid, lane)
        colours = [fills[index % 2] for index in range(len(events))]
        _png_bars(axes, events, 0, top, 0.38, colours)
        for event in events:
            name = _driver_label(event, event["dur"] / US * per_s, px_per_char=5.5)
            if name:
                middle = (event["ts"] + event["dur"] / 2) / US
                axes.text(middle, top - 0.5 + 0.19, name, ha="center", va="center", fontsize=7)
    for event in timeline.slices(pid, format.STALLS):
        _png_bars(axes, [event], 0, 0.0, 1.0, COLOURS["stall"])


def _png_row(axes: Any, timeline: Timeline, summary: RankSummary, row: int, slowest: bool) -> None:
    pid = format.rank_pid(summary.rank)
    if slowest:
        axes.axhspan(row - 0.5, row + 0.5, color=COLOURS["slowest row"], zorder=0)
    for event in timeline.slices(pid, format.LAUNCH):
        colour = COLOURS.get(event.get("name", ""), COLOURS["scheduled"])
        _png_bars(axes, [event], row, 0.06, 0.14, colour)
    steps = timeline.slices(pid, format.STEPS)
    fills = [COLOURS["step"], COLOURS["step alt"]]
    _png_bars(axes, steps, row, 0.24, 0.36, [fills[index % 2] for index in range(len(steps))])
    _png_bars(axes, timeline.slices(pid, format.DATA_WAIT), row, 0.64, 0.14, COLOURS["data wait"])
    _png_bars(axes, timeline.slices(pid, format.CHECKPOINT), row, 0.8, 0.12, COLOURS["checkpoint"])
    for event in timeline.slices(pid, format.STALLS):
        axes.broken_barh(
            [(event["ts"] / US, event["dur"] / US)],
            (row - 0.5, 1.0),
            facecolors=COLOURS["stall"],
            alpha=0.3,
        )
    failures = [e.get("ts", 0) / US for e in timeline.instants(pid, "failure")]
    if failures:
        axes.scatter(
            failures, [row] * len(failures), marker="X", s=80, color=COLOURS["failure"], zorder=5
        )


def _png_columns(figure: Any, axes: Any, timeline: Timeline, first: int) -> None:
    """The data-wait share, mean step and GPU peak of each rank, right of the plot."""
    from matplotlib.transforms import blended_transform_factory

    across = blended_transform_factory(figure.transFigure, axes.transData)
    for index, head in enumerate(COLUMNS):
        x = PNG_COLUMN_X[index]
        axes.text(
            x, -0.5, head, transform=across, ha="center", va="bottom", fontsize=9, fontweight="bold"
        )
        for row, summary in enumerate(timeline.ranks, start=first):
            value = _column_values(summary)[index]
            axes.text(x, row, value, transform=across, ha="center", va="center", fontsize=9)


def _png_legend(figure: Any) -> None:
    """What each colour is, in one line under the time axis."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(color=COLOURS[key], label=label) for key, label in LEGEND[:-2]]
    handles.append(
        Line2D([], [], color=COLOURS["failure"], marker="X", linestyle="", label="failure")
    )
    handles.append(
        Line2D([], [], color=COLOURS["world change"], linestyle="--", label="world change")
    )
    figure.legend(
        handles=handles,
        loc="lower center",
        bbox_to_anchor=(0.45, 0.0),
        ncol=len(handles),
        fontsize=8,
        frameon=False,
        handlelength=1.4,
        columnspacing=1.2,
    )
