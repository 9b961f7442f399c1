"""The chart of the HTML timeline: runs stacked on one time axis, as inline SVG.

A run with few attempts draws one bar per attempt, with its ids in a hover
title. A run with more than can be told apart is drawn per pixel column: each
lane row becomes a strip of columns, a column takes the colour of the most
notable outcome that touches it (``PRIORITY``), and runs of equal columns
become one bar. So a rare failure among thousands of sealed tries still
shows, and the page stays a few hundred kB whatever the attempt count. Runs
with more lanes than ``MAX_ROWS`` fold several lanes into one row.

What a stop did to a try is drawn over its bar, either way: the work a redone
or resumed try lost is hatched (all of a redone one; a resumed one's part
after the capture), a resumed try ends in a triangle (the next run starts its
try with the same triangle) and a restarted one in a cross.
Text labels go through ``labels.Layout``, so none overprints another.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from html import escape

from .._model.stops import StopCost
from .axis import LEFT, PLOT_W, WIDTH, Scale, fmt_rel, nice_step
from .labels import Layout, fit, text_box
from .marks import Mark, MarkTable
from .model import OUTCOME_LABELS, Attempt, RunLine, Timeline, stop_figures

__all__ = ["COLOURS", "PRIORITY", "REDO", "Chart", "Scale", "draw_chart", "fmt_rel"]

# Okabe-Ito: told apart by most colour-blind readers too.
COLOURS = {
    "sealed": "#009E73",
    "failed": "#D55E00",
    "dropped": "#999999",
    "cancelled": "#F0E442",
    "refused": "#56B4E9",
    "abandoned_restart": "#E69F00",
    "whole_group": "#CC79A7",
    "unended": "#0072B2",
}
# Low to high: what a pixel column shows when outcomes share it.
PRIORITY = (
    "sealed",
    "dropped",
    "cancelled",
    "refused",
    "whole_group",
    "abandoned_restart",
    "unended",
    "failed",
)
_CODE = {o: i + 1 for i, o in enumerate(PRIORITY)}
_RUNS_OF_EQUAL = re.compile(rb"([^\x00])\1*")
_RUNS_OF_ONES = re.compile(rb"\x01+")
# The white hatching over the work a stop lost (the page's legend draws it too).
REDO = (
    '<pattern id="redo" width="5" height="5" patternUnits="userSpaceOnUse" '
    'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="5" stroke="#fff" '
    'stroke-width="2" stroke-opacity="0.8"/></pattern>'
)

AXIS_H = 30
MARK_H = 30
BAND_GAP = 18
MIN_BAND = 58
MAX_ROWS = 96
# One bar per attempt up to this many in a run, and in the whole page.
DETAIL_RUN = 3000
DETAIL_TOTAL = 6000
# Font sizes of the chart's text classes (the page's CSS says the same).
TICK_PX, LAB_PX, SUB_PX, STEP_PX, RESTORE_PX, STOP_PX, DOWN_PX = 11, 12, 11, 10, 10, 11, 12
# Baselines of a run's four gutter lines, from the top of its band.
_GUTTER = (13.0, 27.0, 40.0, 53.0)
# The gutter's text starts here and ends this far left of the plot.
_GUTTER_X = 8.0
_GUTTER_GAP = 6.0
# The marks the chart draws (group events and lifecycle events are in the
# JSON document only).
_DRAWN = ("step", "weights", "checkpoint", "snapshot")

Band = tuple[RunLine, float, float, int, float]  # run, top, height, rows, row height


class Chart:
    """The SVG text and what was drawn, for the page's note."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.labels: list[str] = []  # drawn last, over every shape
        self.detailed = 0  # attempts drawn one bar each
        self.merged = 0  # attempts drawn per pixel column
        self.bars = 0
        self.folded: list[str] = []  # runs whose lanes share rows
        self.layout = Layout()

    @property
    def svg(self) -> str:
        return "".join(self.parts)

    def label(
        self, x: float, y: float, text: str, cls: str, size: float, anchor: str, bold: bool = False
    ) -> None:
        """A label that is always drawn (run names, ticks): its place is taken first."""
        self.layout.take(text_box(x, y, text, size, anchor, bold))
        self.labels.append(f'<text x="{x:.1f}" y="{y:.1f}" class="{cls}">{escape(text)}</text>')

    def try_label(
        self,
        places: list[tuple[float, float, str]],
        text: str,
        cls: str,
        size: float,
        bold: bool = False,
        within: tuple[float, float] | None = None,
    ) -> bool:
        """A label at the first free of ``places`` (x, baseline, anchor), or none."""
        fits = [(place, text_box(*place[:2], text, size, place[2], bold)) for place in places]
        if within is not None:
            # The label must fit between these x (inside its own shape).
            fits = [(place, b) for place, b in fits if within[0] <= b[0] and b[2] <= within[1]]
        i = self.layout.place([b for _, b in fits])
        if i is None:
            return False
        x, y, anchor = fits[i][0]
        style = "" if anchor == _CLASS_ANCHOR.get(cls) else f' text-anchor="{anchor}"'
        self.labels.append(
            f'<text x="{x:.1f}" y="{y:.1f}" class="{cls}"{style}>{escape(text)}</text>'
        )
        return True


# The text-anchor each label class has in the page's CSS.
_CLASS_ANCHOR = {
    "tick": "middle",
    "steplab": "middle",
    "rlab": "middle",
    "down": "middle",
    "stoplab": "end",
}


def draw_chart(tl: Timeline) -> Chart:
    chart = Chart()
    x = Scale(tl.t0, tl.t1)
    bands: list[Band] = []
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
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#c5ccd6" stroke-width="2.5"/></pattern>'
        f"{REDO}</defs>"
    )
    _axis(chart, x, total_h)
    _downtime(chart, tl, x, bands)
    budget = DETAIL_TOTAL
    for run, top, height, rows, row_h in bands:
        detail = len(run.attempts) <= min(DETAIL_RUN, budget)
        if detail:
            budget -= len(run.attempts)
        _band(chart, run, x, top, height, rows, row_h, detail, tl)
    # Labels by importance: the stops, the downtime, restores, then steps.
    _stops(chart, tl, x, bands)
    _downtime_labels(chart, tl, x, bands)
    for run, top, _, _, _ in bands:
        _restore_labels(chart, run, x, top)
    for run, top, _, _, _ in bands:
        _step_labels(chart, run.marks, x, top)
    p.extend(chart.labels)
    p.append("</svg>")
    return chart


def _axis(chart: Chart, x: Scale, h: float) -> None:
    # In halves, like Scale: the span itself may be past the float range.
    step = nice_step(x.half_span / 4)
    k = 0
    while k * step * 0.5 <= x.half_span * (1 + 1e-9):
        xx = LEFT + k * step * 0.5 / x.half_span * PLOT_W
        chart.parts.append(
            f'<line x1="{xx:.1f}" y1="{AXIS_H - 6}" x2="{xx:.1f}" y2="{h:.0f}" class="grid"/>'
        )
        chart.label(xx, AXIS_H - 10, fmt_rel(k * step, step), "tick", TICK_PX, "middle")
        k += 1


def _downtimes(
    tl: Timeline, bands: list[Band]
) -> Iterator[tuple[StopCost, tuple[float, float], float, float]]:
    """Each drawn stop: the stop, its span in time (from the stop to restore_started,
    both known numbers), and the top and bottom of its runs' bands."""
    where = {b[0].run_id: (b[1], b[1] + b[2]) for b in bands}
    for stop in tl.stops:
        figures, _ = stop_figures(stop)
        stop_time, downtime = figures["stop_time"], figures["downtime_s"]
        if stop_time is None or downtime is None:
            continue
        if stop.stopped_run not in where or stop.restored_run not in where:
            continue
        span = (stop_time, stop_time + downtime)
        yield stop, span, where[stop.stopped_run][0], where[stop.restored_run][1]


def _downtime(chart: Chart, tl: Timeline, x: Scale, bands: list[Band]) -> None:
    for stop, span, y0, y1 in _downtimes(tl, bands):
        x0, x1 = x(span[0]), x(span[1])
        w = max(x1 - x0, 1.0)
        chart.parts.append(
            f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{w:.1f}" height="{y1 - y0:.1f}" '
            f'fill="url(#hatch)"><title>downtime {stop.downtime_s:,.3f} s: from the stop '
            f"to restore_started</title></rect>"
        )


def _downtime_labels(chart: Chart, tl: Timeline, x: Scale, bands: list[Band]) -> None:
    for _, span, y0, y1 in _downtimes(tl, bands):
        x0, x1 = x(span[0]), x(span[1])
        mid = (y0 + y1) / 2
        label = f"downtime {span[1] - span[0]:,.1f} s"
        chart.try_label(
            [((x0 + x1) / 2, mid, "middle")], label, "down", DOWN_PX, bold=True, within=(x0, x1)
        )


def _band(
    chart: Chart,
    run: RunLine,
    x: Scale,
    top: float,
    height: float,
    rows: int,
    row_h: float,
    detail: bool,
    tl: Timeline,
) -> None:
    p = chart.parts
    x0, x1 = x(run.first_time), x(run.last_time)
    p.append(
        f'<rect x="{x0:.1f}" y="{top:.1f}" width="{max(x1 - x0, 1):.1f}" height="{height:.1f}" '
        'class="band"/>'
    )
    host = run.host if run.host is not None else "unknown host"
    pid = run.pid if run.pid is not None else "?"
    number, attempts = run.index + 1, len(run.attempts)
    state = ("closed cleanly", "sub") if run.closed else ("not closed (killed?)", "warn")
    lines = [
        (f"run {number} · {host}", "lab", LAB_PX),
        (f"pid {pid} · {run.run_id[:8]}", "sub", SUB_PX),
        (f"{attempts:,} attempts · {run.lanes} lanes", "sub", SUB_PX),
        (*state, SUB_PX),
    ]
    # Each line in full in the group's title: a long host name, pid or count
    # is cut short on the chart, so that it stays left of the plot.
    full = (
        f"run {number}: {run.run_id}\nhost {host}, pid {pid}\n"
        f"{attempts:,} attempts in {run.lanes} lanes\n"
        + ("closed cleanly" if run.closed else "no trace_closed (killed?)")
    )
    width = LEFT - _GUTTER_GAP - _GUTTER_X
    p.append(f"<g><title>{escape(full)}</title>")
    for (text, cls, size), dy in zip(lines, _GUTTER, strict=True):
        bold = cls == "lab"
        shown = fit(text, size, width, bold)
        chart.layout.take(text_box(_GUTTER_X, top + dy, shown, size, "start", bold))
        p.append(
            f'<text x="{_GUTTER_X:.0f}" y="{top + dy:.1f}" class="{cls}">{escape(shown)}</text>'
        )
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
                f'class="o-{a.outcome}"><title>{escape(_attempt_title(a, tl))}</title></rect>'
            )
            lost = _lost_part(a)
            if lost is not None:
                lx = x(lost)
                lw = max(x(a.end) - lx, 1.0)
                p.append(
                    f'<rect x="{lx:.1f}" y="{y:.1f}" width="{lw:.1f}" height="{bar_h:.1f}" '
                    'fill="url(#redo)" class="f-lost"/>'
                )
            chart.bars += 1
    else:
        chart.merged += len(run.attempts)
        _raster(chart, run, x, lanes_top, rows, row_h, bar_h, lane_to_row)
    _fate_glyphs(chart, run, x, lanes_top, row_h, bar_h, lane_to_row, tl)


def _attempt_title(a: Attempt, tl: Timeline) -> str:
    outcome = OUTCOME_LABELS[a.outcome]
    lines = [
        f"group {a.group_id} · prompt {a.prompt_id} · generation {a.generation_index} · "
        f"attempt {a.attempt}",
        f"{outcome}{f' ({a.reason})' if a.reason and a.reason != a.outcome else ''}: "
        f"{a.end - a.start:,.3f} s",
    ]
    if a.resumed_turn is not None:
        lines.append(f"started by attempt_resumed, from turn {a.resumed_turn}")
    if not a.started:
        lines.append("started in an earlier run")
    if a.fate is not None:
        lines.append(_fate_text(a, tl))
    return "\n".join(lines)


def _lost_part(a: Attempt) -> float | None:
    """Where the hatched part of a try begins (it ends at the try's end): the work
    a redone or resumed try lost; None for any other try, or where it is not known."""
    if a.fate not in ("redone", "resumed") or not math.isfinite(a.lost_from):
        return None
    return min(max(a.lost_from, a.start), a.end)


def _fate_text(a: Attempt, tl: Timeline) -> str:
    b = tl.run_number(tl.stops[a.stop - 1].restored_run)
    lost = "" if a.lost_s is None else f", {a.lost_s:,.3f} s lost"
    if a.fate == "redone":
        return (
            f"redone: sealed after the state run {b} restored at stop {a.stop} was captured, "
            f"and not resumed, so done again{lost}"
        )
    if a.fate == "resumed":
        where = "in flight at the stop" if a.open else "sealed after the capture"
        after = "" if a.lost_s is None else f"; {a.lost_s:,.3f} s of it after the capture lost"
        return f"resumed by run {b} at stop {a.stop}: {where}{after}"
    return f"{a.fate} by run {b} at stop {a.stop}: in flight at the stop{lost}"


def _fate_glyphs(
    chart: Chart,
    run: RunLine,
    x: Scale,
    lanes_top: float,
    row_h: float,
    bar_h: float,
    lane_to_row: Callable[[int], int],
    tl: Timeline,
) -> None:
    """A triangle where a resumed try stops or picks up, a cross where one is restarted.

    Drawn a little larger than thin rows, so that they show where lanes are
    many: they are as few as the tries running at a stop.
    """
    s = max(7.0, min(bar_h + 2, 11.0))
    h = s / 2
    p = chart.parts
    for a in run.attempts:
        if a.fate not in ("resumed", "restarted") and a.resumed_turn is None:
            continue
        yc = lanes_top + lane_to_row(a.lane) * row_h + bar_h / 2
        if a.resumed_turn is not None:
            xs = x(a.start)
            title = escape(f"started by attempt_resumed, from turn {a.resumed_turn}")
            p.append(
                f'<path d="M{xs:.1f},{yc - h:.1f}l{s * 0.8:.1f},{h:.1f}l{-s * 0.8:.1f},{h:.1f}z" '
                f'class="f-resumed"><title>{title}</title></path>'
            )
        if a.fate == "resumed":
            xe = x(a.end)
            p.append(
                f'<path d="M{xe - s * 0.8:.1f},{yc - h:.1f}l{s * 0.8:.1f},{h:.1f}'
                f'l{-s * 0.8:.1f},{h:.1f}z" class="f-resumed">'
                f"<title>{escape(_fate_text(a, tl))}</title></path>"
            )
        elif a.fate == "restarted":
            xe = x(a.end)
            d = h * 0.8
            p.append(
                f'<path d="M{xe - d:.1f},{yc - d:.1f}l{2 * d:.1f},{2 * d:.1f}'
                f'm0,{-2 * d:.1f}l{-2 * d:.1f},{2 * d:.1f}" class="f-restarted">'
                f"<title>{escape(_fate_text(a, tl))}</title></path>"
            )


def _raster(
    chart: Chart,
    run: RunLine,
    x: Scale,
    lanes_top: float,
    rows: int,
    row_h: float,
    bar_h: float,
    lane_to_row: Callable[[int], int],
) -> None:
    width = PLOT_W + 1
    strips = [bytearray(width) for _ in range(rows)]
    hatched = [bytearray(width) for _ in range(rows)]
    fills = {code: bytes([code]) * width for code in _CODE.values()}
    ones = b"\x01" * width
    # The scale, inlined: this loop runs once per attempt of a large run.
    k = PLOT_W / x.half_span
    h0 = x.t0_half
    last = width - 1
    # Painted from least to most notable, so the notable one wins a column.
    for a in sorted(run.attempts, key=lambda a: _CODE[a.outcome]):
        c0 = min(max(int((a.start * 0.5 - h0) * k), 0), last)
        c1 = max(c0 + 1, min(math.ceil((a.end * 0.5 - h0) * k), width))
        row = lane_to_row(a.lane)
        strips[row][c0:c1] = fills[_CODE[a.outcome]][: c1 - c0]
        lost = _lost_part(a)
        if lost is not None:
            l0 = min(max(int((lost * 0.5 - h0) * k), c0), c1 - 1)
            hatched[row][l0:c1] = ones[: c1 - l0]
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
        for m in _RUNS_OF_ONES.finditer(hatched[row]):
            p.append(
                f'<rect x="{LEFT + m.start()}" y="{y:.1f}" width="{m.end() - m.start()}" '
                f'height="{bar_h:.1f}" fill="url(#redo)" class="f-lost"/>'
            )


def _marks(p: list[str], marks: MarkTable, x: Scale, top: float, bottom: float) -> None:
    seen: dict[str, set[int]] = {}
    guides = marks.count("step") <= PLOT_W / 40
    times = marks.times
    for i in marks.rows(_DRAWN):
        mx = x(times[i])
        # Many marks in one pixel column draw as one (the first by seq): a
        # mark is made only for those drawn.
        column = seen.setdefault(marks.kind(i), set())
        if int(mx) in column:
            continue
        column.add(int(mx))
        m = marks.mark(i)
        title = escape(_mark_title(m))
        if m.kind == "step":
            p.append(f"<g><title>{title}</title>")
            if guides:
                # Guides through the lanes help while steps are few; many would
                # grey the lanes out.
                p.append(
                    f'<line x1="{mx:.1f}" y1="{top + 14:.1f}" x2="{mx:.1f}" y2="{bottom:.1f}" '
                    'class="stepline"/>'
                )
            p.append(
                f'<line x1="{mx:.1f}" y1="{top + 12:.1f}" x2="{mx:.1f}" y2="{top + 26:.1f}" '
                'class="step"/></g>'
            )
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


def _step_labels(chart: Chart, marks: MarkTable, x: Scale, top: float) -> None:
    """Step numbers over their ticks, left to right, each only where it has room."""
    done: set[int] = set()
    for i in marks.rows(("step",)):
        mx = x(marks.times[i])
        if int(mx) in done:
            continue
        done.add(int(mx))
        chart.try_label([(mx, top + 10, "middle")], str(marks.a[i]), "steplab", STEP_PX)


def _mark_title(m: Mark) -> str:
    parts = [m.name]
    args = m.args
    for key in ("path", "weight_version"):
        if key in args:
            parts.append(f"{key}: {args[key]}")
    if m.captured_at is not None:
        before = m.time - m.captured_at
        if before >= 0:
            parts.append(f"captured {before:,.3f} s before it was published")
        else:  # no snapshot is published before it is captured: a clock is off
            parts.append(f"captured_at is {-before:,.3f} s after it was published")
    return "\n".join(parts)


def _restore_took(started: float, finished: float | None) -> str:
    return f"{finished - started:,.1f} s" if finished is not None else "no restore_finished"


def _restores(p: list[str], run: RunLine, x: Scale, top: float) -> None:
    for r in run.restores:
        x0 = x(r.started)
        end = r.finished if r.finished is not None else r.started
        w = max(x(end) - x0, 2.0)
        took = _restore_took(r.started, r.finished)
        title = escape(f"restore from {r.path} (step {r.step}): {took}")
        p.append(
            f'<rect x="{x0:.1f}" y="{top + 12:.1f}" width="{w:.1f}" height="14" rx="2" '
            f'class="restore"><title>{title}</title></rect>'
        )


def _restore_labels(chart: Chart, run: RunLine, x: Scale, top: float) -> None:
    for r in run.restores:
        x0 = x(r.started)
        end = r.finished if r.finished is not None else r.started
        x1 = x0 + max(x(end) - x0, 2.0)
        label = f"restore {_restore_took(r.started, r.finished)}"
        chart.try_label(
            [((x0 + x1) / 2, top + 22.5, "middle")], label, "rlab", RESTORE_PX, within=(x0, x1)
        )


def _stops(chart: Chart, tl: Timeline, x: Scale, bands: list[Band]) -> None:
    where = {b[0].run_id: (b[1], b[1] + b[2]) for b in bands}
    for i, stop in enumerate(tl.stops, 1):
        figures, _ = stop_figures(stop)
        if stop.stopped_run not in where or figures["stop_time"] is None:
            continue
        y0, y1 = where[stop.stopped_run]
        sx = x(figures["stop_time"])
        chart.parts.append(
            f"<g><title>stop {i}: the last event of run {escape(str(stop.stopped_run))}</title>"
            f'<line x1="{sx:.1f}" y1="{y0 - 4:.1f}" x2="{sx:.1f}" y2="{y1 + 4:.1f}" class="stop"/>'
            "</g>"
        )
        # Beside the line at the top of the band, left then right; else just
        # above the band, in the gap between runs.
        places = [
            (sx - 4, y0 + 10, "end"),
            (sx + 4, y0 + 10, "start"),
            (sx - 4, y0 - 5, "end"),
            (sx + 4, y0 - 5, "start"),
        ]
        chart.try_label(places, f"stop {i}", "stoplab", STOP_PX, bold=True)
