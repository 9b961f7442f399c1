"""The timeline as one self-contained HTML page: inline CSS and SVG, no script.

Nothing is fetched (a Content-Security-Policy forbids it, and forbids scripts,
so a page that somehow carried one would still not run it), and every string
taken from the trace goes through ``html.escape``. Hover titles carry the ids.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable
from html import escape

from .._model.stops import FIGURE_ROWS
from .._schema.decoding import AnyEvent
from .._version import __version__
from .chart import COLOURS, PRIORITY, REDO, Chart, draw_chart, fmt_rel
from .model import FATES, OUTCOME_LABELS, OUTCOMES, Timeline, build_timeline, stop_figures

__all__ = ["NOTES_SHOWN", "timeline_html", "html_of"]

_CSS = """
*{box-sizing:border-box}
body{margin:0;padding:18px 22px;font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,
"Helvetica Neue",Arial,sans-serif;color:#1d2430;background:#fff}
h1{font-size:19px;margin:0 0 2px}
h2{font-size:14px;margin:0 0 6px}
.meta,.note{color:#566173;margin:2px 0}
.note{font-size:12px}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;margin:4px 0;font-size:12px}
.legend span{display:inline-flex;align-items:center;gap:5px}
.legend b{font-weight:600;color:#566173}
.legends{margin:10px 0 8px}
.sw{width:13px;height:11px;border-radius:2px;display:inline-block}
.legend svg{width:14px;height:14px}
.wrap{display:flex;gap:18px;align-items:flex-start;flex-wrap:wrap}
.chart{flex:1 1 720px;min-width:0}
.chart svg{width:100%;height:auto;display:block}
aside{flex:0 0 300px}
.card{border:1px solid #dde2ea;border-radius:6px;padding:10px 12px;margin:0 0 12px;
background:#fafbfc}
.card p{margin:0 0 6px;color:#566173;font-size:12px;overflow-wrap:anywhere}
table{border-collapse:collapse;width:100%;font-size:12px}
td{padding:2px 4px;border-top:1px solid #eceff3}
td.v{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.u{color:#7a8494}
tr.key td{font-weight:600}
.na{color:#b03a2e}
tr.why td{border-top:0;color:#b03a2e;font-size:11px;padding:0 4px 4px 14px;overflow-wrap:anywhere}
.card ul{margin:0 0 6px;padding-left:16px;font-size:12px;color:#566173}
.card li{margin:0 0 4px;overflow-wrap:anywhere}
.grid{stroke:#edf0f4;stroke-width:1}
.tick{font-size:11px;fill:#7a8494;text-anchor:middle}
.band{fill:#f7f8fa;stroke:#e3e7ee}
.lab{font-size:12px;font-weight:600;fill:#1d2430}
.sub{font-size:11px;fill:#6b7585}
.warn{font-size:11px;fill:#b03a2e}
.stepline{stroke:#d5dae2;stroke-width:1}
.step{stroke:#1d2430;stroke-width:1.6}
.steplab{font-size:10px;fill:#1d2430;text-anchor:middle}
.weights{fill:#8a93a3}
.ckpt{fill:#7d3c98}
.snap{fill:#1a5276}
.captured{fill:#fff;stroke:#1a5276;stroke-width:1.4}
.capline{stroke:#1a5276;stroke-width:1.2;stroke-dasharray:3 2}
.restore{fill:#34495e}
.rlab{font-size:10px;fill:#fff;text-anchor:middle}
.stop{stroke:#c0392b;stroke-width:2;stroke-dasharray:5 3}
.stoplab{font-size:11px;font-weight:600;fill:#c0392b;text-anchor:end}
.down{font-size:12px;fill:#566173;text-anchor:middle;font-weight:600}
.f-lost{pointer-events:none}
.f-resumed{fill:#fff;stroke:#1d2430;stroke-width:1.3}
.f-restarted{fill:none;stroke:#1d2430;stroke-width:1.8}
"""

_OUTCOME_CSS = "".join(f".o-{o}{{fill:{c}}}" for o, c in COLOURS.items())
_MARKER_LEGEND = (
    ('<line x1="7" y1="1" x2="7" y2="13" stroke="#1d2430" stroke-width="2"/>', "step trained"),
    ('<circle cx="7" cy="7" r="2.6" fill="#8a93a3"/>', "weights synced"),
    ('<path d="M2,3h10l-5,9z" fill="#7d3c98"/>', "trainer checkpoint"),
    (
        '<path d="M9,1l6,6l-6,6l-6,-6z" fill="#1a5276"/>'
        '<circle cx="2.5" cy="7" r="2" fill="#fff" stroke="#1a5276"/>',
        "snapshot (o = captured)",
    ),
    ('<rect x="0" y="3" width="14" height="8" rx="2" fill="#34495e"/>', "restore"),
    (
        '<line x1="7" y1="0" x2="7" y2="14" stroke="#c0392b" stroke-width="2" '
        'stroke-dasharray="4 2"/>',
        "stop",
    ),
    ('<rect width="14" height="14" fill="#dfe3e9"/>', "downtime"),
)
# What a stop did, drawn over a bar: (swatch, what the mark is).
_FATE_LEGEND = {
    "resumed": (
        '<rect y="3" width="14" height="8" fill="{unended}"/>'
        '<rect x="5" y="3" width="9" height="8" fill="url(#redo)"/>'
        '<path d="M7,2.5l6,4.5l-6,4.5z" class="f-resumed"/>',
        "open at a stop or sealed after the capture, resumed by the next run (the same "
        "triangle starts its try there); hatched: its work after the capture, done again",
    ),
    "restarted": (
        '<rect y="3" width="14" height="8" fill="{unended}"/>'
        '<path d="M8,3.5l6,6m0,-6l-6,6" class="f-restarted"/>',
        "in flight at a stop, started over by the next run",
    ),
    "redone": (
        '<rect y="3" width="14" height="8" fill="{sealed}"/>'
        '<rect y="3" width="14" height="8" fill="url(#redo)"/>',
        "sealed after the restored state was captured and not resumed, so done again",
    ),
}
_KEY_FIGURES = frozenset({"downtime_s", "lost_s", "lost_steps"})
# Notes listed on the page (a run read twice is a note per run: a set of
# thousands of runs copied twice would bury the stops); the document has all.
NOTES_SHOWN = 20


def timeline_html(events: Iterable[AnyEvent], *, title: str = "rollout_trace timeline") -> str:
    """One self-contained HTML page showing the trace set's timeline.

    Runs one after another on a shared time axis, attempts as bars coloured by
    outcome, steps, checkpoints, snapshots and restores as marks, the downtime
    of each stop shaded and its restore-cost figures beside the chart.
    """
    return html_of(build_timeline(events), title=title)


def html_of(tl: Timeline, *, title: str = "rollout_trace timeline") -> str:
    """The page of an already built ``Timeline``."""
    chart = draw_chart(tl)
    counts: Counter[str] = Counter(a.outcome for r in tl.runs for a in r.attempts)
    fates = _stop_counts(tl)
    try:
        origin = dt.datetime.fromtimestamp(tl.t0, tz=dt.timezone.utc).strftime(
            "%Y-%m-%d %H:%M:%S UTC"
        )
    except (OverflowError, ValueError, OSError):  # milliseconds, or no date at all
        shown = f"{tl.t0:.3f}" if abs(tl.t0) < 1e15 else f"{tl.t0:.6g}"
        origin = f"{shown} (not a date)"
    stops = len(tl.stops)
    meta = (
        f"{len(tl.runs)} run(s) · {tl.attempt_count:,} attempts · {stops} stop(s) · "
        f"spans {fmt_rel(tl.t1 - tl.t0)} · time 0 is {origin}"
    )
    head = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; img-src data:\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="generator" content="rollout_trace {escape(__version__)}">'
        f"<title>{escape(title)}</title><style>{_CSS}{_OUTCOME_CSS}</style></head><body>"
    )
    body = [
        f"<h1>{escape(title)}</h1>",
        f'<p class="meta">{escape(meta)}</p>',
        f'<p class="note" id="shown">{escape(_note(tl, chart))}</p>',
        _legend(counts, fates),
        '<div class="wrap"><div class="chart">',
        chart.svg,
        "</div><aside>",
        _stop_cards(tl),
        _notes(tl),
        "</aside></div></body></html>",
    ]
    return head + "".join(body)


def _note(tl: Timeline, chart: Chart) -> str:
    total = tl.attempt_count
    if total == 0:
        return "no attempts in this trace set"
    if not chart.merged:
        note = f"showing all {total:,} attempts, one bar each (hover a bar for its ids)"
    else:
        order = " > ".join(o.replace("_", " ") for o in reversed(PRIORITY))
        shown = f"{chart.detailed:,} of {total:,} attempts one bar each; the other"
        if not chart.detailed:
            shown = f"{total:,} attempts:"
        note = (
            f"showing {shown} {chart.merged:,} are too many to draw apart and are merged per "
            f"pixel column into {chart.bars - chart.detailed:,} bars (a column shows its most "
            f"notable outcome: {order}); the JSON output (rollout-trace timeline -o OUT.json) "
            "has every attempt"
        )
    if chart.folded:
        note += "; lanes share rows in " + ", ".join(chart.folded)
    return note


def _stop_counts(tl: Timeline) -> dict[str, int | None]:
    """What the stops did, for the legend: each class's figure summed over the
    stops (None, n/a, where a stop's figure is: its C unknown, say), so the
    legend says what the figures say."""
    out: dict[str, int | None] = {}
    for fate in FATES:
        values = [getattr(stop, fate) for stop in tl.stops]
        out[fate] = None if None in values else sum(values)
    return out


def _legend(counts: Counter[str], fates: dict[str, int | None]) -> str:
    # Outcomes count tries; the marks of a stop count siblings under the names
    # of the figures that count them, so a word means one thing on the page.
    out = ['<div class="legends"><div class="legend"><b>tries, by how they ended:</b>']
    for outcome in OUTCOMES:
        out.append(
            f'<span title="{escape(_OUTCOME_MEANING[outcome])}"><i class="sw" '
            f'style="background:{COLOURS[outcome]}"></i>'
            f'<span class="k">{OUTCOME_LABELS[outcome]}</span> '
            f'<span class="n">{counts.get(outcome, 0):,}</span></span>'
        )
    out.append(
        '</div><div class="legend"><b>what a stop did (siblings, as its figures count them):</b>'
    )
    for fate in FATES:
        svg, meaning = _FATE_LEGEND[fate]
        swatch = svg.format(**COLOURS)
        out.append(
            f'<span title="{escape(meaning)}"><svg viewBox="0 0 14 14"><defs>{REDO}</defs>'
            f'{swatch}</svg><span class="k">{fate}</span> '
            f'<span class="n">{_count(fates.get(fate, 0))}</span></span>'
        )
    out.append('</div><div class="legend"><b>marks:</b>')
    for svg, label in _MARKER_LEGEND:
        out.append(f'<span><svg viewBox="0 0 14 14">{svg}</svg>{label}</span>')
    out.append("</div></div>")
    return "".join(out)


def _count(n: int | None) -> str:
    return "n/a" if n is None else f"{n:,}"


_OUTCOME_MEANING = {
    "sealed": "attempt_sealed: the try's result was kept",
    "failed": "attempt_abandoned, reason failed: the try raised",
    "dropped": "attempt_abandoned, reason dropped: thrown away (e.g. stale)",
    "cancelled": "attempt_abandoned, reason cancelled: stopped on purpose",
    "refused": "attempt_refused",
    "abandoned_restart": "attempt_abandoned, reason restart: a restored run found the try "
    "interrupted and starts it over (the restarted figure counts siblings in flight at a stop)",
    "whole_group": "attempt_abandoned, reason whole_group: taken down with its group",
    "unended": "no attempt_sealed, attempt_refused or attempt_abandoned in its run: "
    "running at the run's last event",
}


def _value(v: object, figure: str, t0: float) -> str:
    if v is None:
        return "n/a"
    if figure in ("stop_time", "captured_at"):
        return f"at {fmt_rel(float(v) - t0)}"  # type: ignore[arg-type]
    if isinstance(v, int):
        return f"{v:,}"
    assert isinstance(v, float)
    return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.1f}"


def _notes(tl: Timeline) -> str:
    """What the cost analysis noted, under the stops: the first ``NOTES_SHOWN`` of them."""
    if not tl.notes:
        return ""
    out = [f'<div class="card" id="notes"><h2>Notes ({len(tl.notes):,})</h2><ul>']
    out += [f"<li>{escape(str(n))}</li>" for n in tl.notes[:NOTES_SHOWN]]
    out.append("</ul>")
    more = len(tl.notes) - NOTES_SHOWN
    if more > 0:
        out.append(
            f"<p>and {more:,} more: the JSON output (otherData.notes) and "
            "rollout-trace cost list every one</p>"
        )
    out.append("</div>")
    return "".join(out)


def _stop_cards(tl: Timeline) -> str:
    if not tl.stops:
        return (
            '<div class="card"><h2>No stops</h2><p>No run in this trace set begins with '
            "a restore, so there is no restore cost to show.</p></div>"
        )
    out = []
    for i, stop in enumerate(tl.stops, 1):
        a = tl.run_number(stop.stopped_run) or "?"
        b = tl.run_number(stop.restored_run) or "?"
        figures, reasons = stop_figures(stop)
        out.append(
            f'<div class="card" id="stop-{i}"><h2>stop {i}: run {a} → run {b}</h2>'
            f"<p>run {b} restored <b>{escape(stop.restore_path)}</b> (step "
            f"{stop.restored_step})</p><table>"
        )
        for figure, (unit, what) in FIGURE_ROWS.items():
            value = _value(figures.get(figure), figure, tl.t0)
            why = reasons.get(figure)
            cls = ' class="key"' if figure in _KEY_FIGURES else ""
            vcls = "v na" if why else "v"
            unit_text = "" if figure in ("stop_time", "captured_at") else unit
            out.append(
                f'<tr{cls} title="{escape(what)}"><td>{figure}</td>'
                f'<td class="{vcls}">{escape(value)}</td>'
                f'<td class="u">{escape(unit_text)}</td></tr>'
            )
            if why:
                # In the card's text, not only in a hover title: a reader
                # should not have to find out that there is one.
                out.append(f'<tr class="why"><td colspan="3">n/a: {escape(why)}</td></tr>')
        out.append("</table></div>")
    return "".join(out)
