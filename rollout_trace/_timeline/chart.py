"""The chart of the HTML timeline: runs stacked on one time axis, as inline SVG.

A run with few attempts draws one bar per attempt, with its ids in a hover
title. A run with more than can be told apart is drawn per pixel column: each
lane row becomes a strip of columns, a column takes the colour of the most
notable outcome that touches it (``PRIORITY``), and runs of equal columns
become one bar. So a rare failure among thousands of sealed tries still
shows, and the page stays a few hundred kB whatever the attempt count. Runs
with more lanes than ``MAX_ROWS`` fold several lanes into one row.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from html import escape

from .model import Attempt, Mark, RunLine, Timeline

__all__ = ["COLOURS", "PRIORITY", "Chart", "draw_chart", "fmt_rel"]

# Okabe-Ito: told apart by most colour-blind readers too.
COLOURS = {
    "sealed": "#009E73",
    "failed": "#D55E00",
    "dropped": "#999999",
    "cancelled": "#F0E442",
    "refused": "#56B4E9",
    "restarted": "#E69F00",
    "whole_group": "#CC79A7",
    "in_flight": "#0072B2",
}
# Low to high: what a pixel column shows when outcomes share it.
PRIORITY = (
    "sealed",
    "dropped",
    "cancelled",
    "refused",
    "whole_group",
    "restarted",
    "in_flight",
    "failed",
)
_CODE = {o: i + 1 for i, o in enumerate(PRIORITY)}
_RUNS_OF_EQUAL = re.compile(rb"([^\x00])\1*")

WIDTH = 1040
LEFT = 176
RIGHT = 16
PLOT_W = WIDTH - LEFT - RIGHT
AXIS_H = 30
MARK_H = 30
BAND_GAP = 18
MIN_BAND = 58
MAX_ROWS = 96
# One bar per attempt up to this many in a run, and in the whole page.
DETAIL_RUN = 3000
DETAIL_TOTAL = 6000


class Chart:
    """The SVG text and what was drawn, for the page's note."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.detailed = 0  # attempts drawn one bar each
        self.merged = 0  # attempts drawn per pixel column
        self.bars = 0
        self.folded: list[str] = []  # runs whose lanes share rows

    @property
    def svg(self) -> str:
        return "".join(self.parts)


def fmt_rel(s: float, step: float = 0.0) -> str:
    """Seconds since the time origin as ``12.5 s``, ``4:05`` or ``1:04:05``."""
    if step and step < 1:
        return f"{s:.1f} s"
    if abs(s) < 60 and (not step or step < 60):
        return f"{s:.1f} s" if s % 1 else f"{s:.0f} s"
    sign = "-" if s < 0 else ""
    whole = round(abs(s))
    h, rest = divmod(whole, 3600)
    m, sec = divmod(rest, 60)
    return f"{sign}{h}:{m:02d}:{sec:02d}" if h else f"{sign}{m}:{sec:02d}"


def _nice_step(span: float) -> float:
    target = span / 8
    for step in (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600):
        if step >= target:
            return float(step)
    return 3600.0 * math.ceil(target / 3600)


def draw_chart(tl: Timeline) -> Chart:
    chart = Chart()
    span = max(tl.t1 - tl.t0, 1e-6)

    def x(t: float) -> float:
        return LEFT + (t - tl.t0) / span * PLOT_W

    bands: list[tuple[RunLine, float, float, int, float]] = []
    y = AXIS_H + 6.0
    for run in tl.runs:
        rows = max(1, min(run.lanes, MAX_ROWS))
        row_h = max(2.0, min(16.0, 220 / rows))
        height = max(MIN_BAND, MARK_H + rows * row_h + 6)
        bands.append((run, y, height, rows, row_h))
        y += height + BAND_GAP
    total_h = y + 4
    p = chart.parts
    p.append(
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {total_h:.0f}" '
        f'width="{WIDTH}" height="{total_h:.0f}" role="img" aria-label="timeline">'
        '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#eceff3"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#c5ccd6" stroke-width="2.5"/></pattern></defs>'
    )
    _axis(p, tl, x, span, total_h)
    _downtime(p, tl, x, bands, total_h)
    budget = DETAIL_TOTAL
    for run, top, height, rows, row_h in bands:
        detail = len(run.attempts) <= min(DETAIL_RUN, budget)
        if detail:
            budget -= len(run.attempts)
        _band(chart, run, x, top, height, rows, row_h, detail)
    _stops(p, tl, x, bands)
    p.append("</svg>")
    return chart


def _axis(p: list[str], tl: Timeline, x: Callable[[float], float], span: float, h: float) -> None:
    step = _nice_step(span)
    k = 0
    while k * step <= span + 1e-9:
        xx = x(tl.t0 + k * step)
        p.append(
            f'<line x1="{xx:.1f}" y1="{AXIS_H - 6}" x2="{xx:.1f}" y2="{h:.0f}" class="grid"/>'
            f'<text x="{xx:.1f}" y="{AXIS_H - 10}" class="tick">{fmt_rel(k * step, step)}</text>'
        )
        k += 1


def _downtime(
    p: list[str],
    tl: Timeline,
    x: Callable[[float], float],
    bands: list[tuple[RunLine, float, float, int, float]],
    h: float,
) -> None:
    top = {b[0].run_id: b[1] for b in bands}
    bottom = {b[0].run_id: b[1] + b[2] for b in bands}
    for stop in tl.stops:
        if stop.stopped_run not in top or stop.restored_run not in top:
            continue
        x0, x1 = x(stop.stop_time), x(stop.stop_time + stop.downtime_s)
        y0 = top[stop.stopped_run]
        y1 = bottom[stop.restored_run]
        w = max(x1 - x0, 1.0)
        p.append(
            f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{w:.1f}" height="{y1 - y0:.1f}" '
            f'fill="url(#hatch)"><title>downtime {stop.downtime_s:,.3f} s: from the stop '
            f"to restore_started</title></rect>"
        )
        label = f"downtime {stop.downtime_s:,.1f} s"
        if w > 7 * len(label):
            mid = (y0 + y1) / 2
            p.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{mid:.1f}" class="down">{label}</text>')


def _band(
    chart: Chart,
    run: RunLine,
    x: Callable[[float], float],
    top: float,
    height: float,
    rows: int,
    row_h: float,
    detail: bool,
) -> None:
    p = chart.parts
    x0, x1 = x(run.first_time), x(run.last_time)
    p.append(
        f'<rect x="{x0:.1f}" y="{top:.1f}" width="{max(x1 - x0, 1):.1f}" height="{height:.1f}" '
        'class="band"/>'
    )
    state = "closed cleanly" if run.closed else "no trace_closed (killed?)"
    host = run.host if run.host is not None else "unknown host"
    pid = run.pid if run.pid is not None else "?"
    lines = [
        (f"run {run.index + 1} · {host[:18]}", "lab"),
        (f"pid {pid} · {run.run_id[:8]}", "sub"),
        (f"{len(run.attempts):,} attempts · {run.lanes} lanes", "sub"),
        (state, "sub" if run.closed else "warn"),
    ]
    full = f"run {run.run_id} on {host}, pid {pid}: {state}"
    p.append(f"<g><title>{escape(full)}</title>")
    for i, (text, cls) in enumerate(lines):
        p.append(f'<text x="8" y="{top + 13 + 13 * i:.1f}" class="{cls}">{escape(text)}</text>')
    p.append("</g>")
    lanes_top = top + MARK_H
    _marks(p, run.marks, x, top, lanes_top + rows * row_h)
    _restores(p, run, x, top)

    def lane_to_row(lane: int) -> int:
        return lane * rows // run.lanes if run.lanes > rows else lane

    if run.lanes > rows:
        chart.folded.append(f"run {run.index + 1}: {run.lanes} lanes in {rows} rows")
    bar_h = row_h - 1 if row_h >= 4 else row_h
    if detail:
        chart.detailed += len(run.attempts)
        for a in run.attempts:
            y = lanes_top + lane_to_row(a.lane) * row_h
            ax = x(a.start)
            # An end whose start is in an earlier run has no length: a tick.
            w = max(x(a.end) - ax, 1.0 if a.started else 3.0)
            p.append(
                f'<rect x="{ax:.1f}" y="{y:.1f}" width="{w:.1f}" height="{bar_h:.1f}" '
                f'class="o-{a.outcome}"><title>{escape(_attempt_title(a, run))}</title></rect>'
            )
            chart.bars += 1
    else:
        chart.merged += len(run.attempts)
        _raster(chart, run, x, lanes_top, rows, row_h, bar_h, lane_to_row)


def _attempt_title(a: Attempt, run: RunLine) -> str:
    outcome = a.outcome.replace("_", " ")
    lines = [
        f"group {a.group_id} · prompt {a.prompt_id} · generation {a.generation_index} · "
        f"attempt {a.attempt}",
        f"{outcome}{f' ({a.reason})' if a.reason and a.reason != a.outcome else ''}: "
        f"{a.end - a.start:,.3f} s",
    ]
    if a.resumed_turn is not None:
        lines.append(f"resumed from turn {a.resumed_turn}")
    if not a.started:
        lines.append("started in an earlier run")
    if a.after_stop:
        lines.append(a.after_stop)
    return "\n".join(lines)


def _raster(
    chart: Chart,
    run: RunLine,
    x: Callable[[float], float],
    lanes_top: float,
    rows: int,
    row_h: float,
    bar_h: float,
    lane_to_row: Callable[[int], int],
) -> None:
    width = PLOT_W + 1
    strips = [bytearray(width) for _ in range(rows)]
    fills = {code: bytes([code]) * width for code in _CODE.values()}
    # Painted from least to most notable, so the notable one wins a column.
    for a in sorted(run.attempts, key=lambda a: _CODE[a.outcome]):
        c0 = min(int(x(a.start)) - LEFT, width - 1)
        c1 = max(c0 + 1, min(math.ceil(x(a.end)) - LEFT, width))
        strips[lane_to_row(a.lane)][c0:c1] = fills[_CODE[a.outcome]][: c1 - c0]
    p = chart.parts
    for row, strip in enumerate(strips):
        y = lanes_top + row * row_h
        for m in _RUNS_OF_EQUAL.finditer(strip):
            outcome = PRIORITY[m.group()[0] - 1]
            p.append(
                f'<rect x="{LEFT + m.start()}" y="{y:.1f}" width="{m.end() - m.start()}" '
                f'height="{bar_h:.1f}" class="o-{outcome}"/>'
            )
            chart.bars += 1


def _marks(
    p: list[str], marks: list[Mark], x: Callable[[float], float], top: float, bottom: float
) -> None:
    seen: dict[str, set[int]] = {}
    steps = [m for m in marks if m.kind == "step"]
    label_steps = len(steps) <= PLOT_W / 40
    for m in marks:
        if m.kind not in ("step", "weights", "checkpoint", "snapshot"):
            continue
        mx = x(m.time)
        # Many marks in one pixel column draw as one.
        column = seen.setdefault(m.kind, set())
        if int(mx) in column:
            continue
        column.add(int(mx))
        title = escape(_mark_title(m))
        if m.kind == "step":
            p.append(f"<g><title>{title}</title>")
            if label_steps:
                # Guides through the lanes help while steps are few; many would
                # grey the lanes out.
                p.append(
                    f'<line x1="{mx:.1f}" y1="{top + 14:.1f}" x2="{mx:.1f}" y2="{bottom:.1f}" '
                    'class="stepline"/>'
                )
            p.append(
                f'<line x1="{mx:.1f}" y1="{top + 12:.1f}" x2="{mx:.1f}" y2="{top + 26:.1f}" '
                'class="step"/>'
            )
            if label_steps:
                step = m.args["step"]
                p.append(f'<text x="{mx:.1f}" y="{top + 10:.1f}" class="steplab">{step}</text>')
            p.append("</g>")
        elif m.kind == "weights":
            p.append(
                f'<circle cx="{mx:.1f}" cy="{top + 24:.1f}" r="2.2" class="weights">'
                f"<title>{title}</title></circle>"
            )
        elif m.kind == "checkpoint":
            y = top + 19
            p.append(
                f'<path d="M{mx - 5:.1f},{y - 5:.1f}h10l-5,9z" class="ckpt">'
                f"<title>{title}</title></path>"
            )
        else:
            y = top + 19
            cx = x(m.captured_at) if m.captured_at is not None else mx
            p.append(
                f'<g><title>{title}</title><line x1="{cx:.1f}" y1="{y:.1f}" x2="{mx:.1f}" '
                f'y2="{y:.1f}" class="capline"/><circle cx="{cx:.1f}" cy="{y:.1f}" r="3" '
                f'class="captured"/><path d="M{mx:.1f},{y - 6:.1f}l6,6l-6,6l-6,-6z" '
                'class="snap"/></g>'
            )


def _mark_title(m: Mark) -> str:
    parts = [m.name]
    for key in ("path", "weight_version"):
        if key in m.args:
            parts.append(f"{key}: {m.args[key]}")
    if m.captured_at is not None:
        parts.append(f"captured {m.time - m.captured_at:,.3f} s before it was published")
    return "\n".join(parts)


def _restores(p: list[str], run: RunLine, x: Callable[[float], float], top: float) -> None:
    for r in run.restores:
        x0 = x(r.started)
        end = r.finished if r.finished is not None else r.started
        w = max(x(end) - x0, 2.0)
        took = f"{end - r.started:,.1f} s" if r.finished is not None else "no restore_finished"
        title = escape(f"restore from {r.path} (step {r.step}): {took}")
        p.append(
            f'<g><title>{title}</title><rect x="{x0:.1f}" y="{top + 12:.1f}" width="{w:.1f}" '
            f'height="14" rx="2" class="restore"/>'
        )
        label = f"restore {took}"
        if w > 6.2 * len(label):
            p.append(f'<text x="{x0 + w / 2:.1f}" y="{top + 22.5:.1f}" class="rlab">{label}</text>')
        p.append("</g>")


def _stops(
    p: list[str],
    tl: Timeline,
    x: Callable[[float], float],
    bands: list[tuple[RunLine, float, float, int, float]],
) -> None:
    where = {b[0].run_id: (b[1], b[1] + b[2]) for b in bands}
    for i, stop in enumerate(tl.stops, 1):
        if stop.stopped_run not in where:
            continue
        y0, y1 = where[stop.stopped_run]
        sx = x(stop.stop_time)
        p.append(
            f"<g><title>stop {i}: the last event of run {escape(stop.stopped_run)}</title>"
            f'<line x1="{sx:.1f}" y1="{y0 - 4:.1f}" x2="{sx:.1f}" y2="{y1 + 4:.1f}" class="stop"/>'
            f'<text x="{sx - 4:.1f}" y="{y0 + 10:.1f}" class="stoplab">stop {i}</text></g>'
        )
