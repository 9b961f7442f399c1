"""What the HTML timeline says: words of one meaning, what a stop did, labels apart, reasons."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from html import unescape
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import msgspec
import pytest
import timeline_data as td
from headless import CHROMIUM, Page
from scenario import captured_stop, disp, make_run, restore, restored, resume, seal, snapshot, step

import rollout_trace as rt
from rollout_trace._model.stops import FIGURES
from rollout_trace._model.traceset import analyze
from rollout_trace._timeline.chart import LEFT
from rollout_trace._timeline.labels import text_box

EXAMPLE = Path(__file__).parents[1] / "data" / "example"

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"),
    reason="Chromium is not installed (apt-get install chromium)",
)


class _Legend(HTMLParser):
    """Each legend entry's text, e.g. ``sealed 39``: a span directly in a ``legend`` div."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: list[str] = []
        self._stack: list[str] = []  # "legend", "entry" or "" per open element
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("i", "path", "rect", "circle", "line", "br"):
            return  # void in this page (or closed at once)
        classes = (dict(attrs).get("class") or "").split()
        if tag == "div" and "legend" in classes:
            kind = "legend"
        elif tag == "span" and self._stack and self._stack[-1] == "legend":
            kind = "entry"
            self._text = []
        else:
            kind = ""
        self._stack.append(kind)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("i", "path", "rect", "circle", "line", "br") or not self._stack:
            return
        if self._stack.pop() == "entry":
            self.entries.append(" ".join("".join(self._text).split()))

    def handle_data(self, data: str) -> None:
        if "entry" in self._stack:
            self._text.append(data)


def _legend(page: str) -> dict[str, int]:
    """Legend entries that carry a count, label -> count."""
    parser = _Legend()
    parser.feed(page)
    out = {}
    for entry in parser.entries:
        m = re.fullmatch(r"(.+?) ([\d,]+)", entry)
        if m:
            out[m.group(1)] = int(m.group(2).replace(",", ""))
    return out


@pytest.fixture(scope="module")
def example_page() -> str:
    return rt.timeline_html(rt.read(EXAMPLE))


@pytest.fixture(scope="module")
def example_stop() -> Any:
    [stop] = rt.restore_costs(rt.read(EXAMPLE))
    return stop


def test_a_legend_word_that_names_a_figure_counts_what_the_figure_counts(
    example_page: str, example_stop: Any
) -> None:
    # The example's run B reports a try that had already failed as a restart
    # too: two abandoned-for-restart tries, one restarted sibling.
    legend = _legend(example_page)
    assert len(legend) >= 8  # the outcomes are there, with their counts
    named = {f: f for f in FIGURES} | {f.replace("_", " "): f for f in FIGURES}
    shown = {label: named[label] for label in legend if label in named}
    assert set(shown.values()) == {"resumed", "restarted", "redone"}
    for label, figure in shown.items():
        assert legend[label] == getattr(example_stop, figure), label
    # And the outcome counts add up to the attempts.
    attempts = sum(n for label, n in legend.items() if label not in named)
    assert f"{attempts} attempts" in example_page


def _svg_titles(page: str, cls: str) -> list[str]:
    """The hover titles of the shapes of class ``cls``."""
    return re.findall(rf'class="{cls}"><title>([^<]*)</title>', page)


def test_what_the_stop_did_is_marked_on_the_bars(example_page: str, example_stop: Any) -> None:
    # Every redone try is hatched, and so is the part after the capture of every
    # resumed one (the example's resumed try ran across the capture).
    hatched = example_page.count('class="f-lost"')
    assert hatched == example_stop.redone + example_stop.resumed == 13 + 1
    glyphs = _svg_titles(example_page, "f-resumed") + _svg_titles(example_page, "f-restarted")
    ends = [t for t in glyphs if "at stop 1" in t]
    assert sum(t.startswith("resumed by run 2") for t in ends) == example_stop.resumed == 1
    assert sum(t.startswith("restarted by run 2") for t in ends) == example_stop.restarted == 1
    resumes = sum(isinstance(e, rt.AttemptResumed) for e in rt.read(EXAMPLE))
    assert sum(t.startswith("started by attempt_resumed") for t in glyphs) == resumes > 0


def test_a_resumed_try_is_hatched_from_the_capture_and_a_redone_one_whole() -> None:
    # C = 110. Prompt 1: dispatched 100, sealed 120, resumed by B: its lost part
    # is 110-120, half its bar. Prompt 2: dispatched 112, sealed 118, not
    # resumed: redone, all of it.
    events = captured_stop()
    page = rt.timeline_html(events)
    bars = re.findall(
        r'<rect x="([\d.]+)" y="[^"]*" width="([\d.]+)" [^>]*class="o-sealed"><title>group grp-(\d)'
        r'[^<]*</title></rect><rect x="([\d.]+)" y="[^"]*" width="([\d.]+)" [^>]*class="f-lost"/>',
        page,
    )
    got = {int(p): (float(bx), float(bw), float(hx), float(hw)) for bx, bw, p, hx, hw in bars}
    assert sorted(got) == [1, 2]
    bx, bw, hx, hw = got[1]
    assert hx == pytest.approx(bx + bw / 2, abs=0.2) and hw == pytest.approx(bw / 2, abs=0.2)
    bx, bw, hx, hw = got[2]
    assert (hx, hw) == (bx, bw)
    legend = _legend(page)
    assert (legend["resumed"], legend["restarted"], legend["redone"]) == (1, 0, 1)
    doc = rt.timeline_document(events)
    args = {
        e["args"]["prompt_id"]: e["args"]
        for e in doc["traceEvents"]
        if e.get("cat") == "attempt" and e["ph"] == "b" and e["pid"] == 1
    }
    assert args[1]["after_stop"] == (
        "resumed by run 2 at stop 1 (sealed after the capture; counted in resumed)"
    )
    assert args[1]["lost_s"] == 10.0 and args[2]["lost_s"] == 6.0
    assert "redone" in args[2]


def _stop_legend(page: str) -> dict[str, str]:
    """The legend's entries for what a stop did: class -> what it shows (a count or n/a)."""
    parser = _Legend()
    parser.feed(page)
    out = {}
    for entry in parser.entries:
        m = re.fullmatch(r"(resumed|restarted|redone) ([\d,]+|n/a)", entry)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def test_the_legend_says_n_a_where_a_stop_s_figure_is_n_a() -> None:
    # B restores a path A never published, so C is unknown: the try open at the
    # stop is resumed, but resumed and redone are n/a (they need C), and the
    # legend must not print counts the figures do not give.
    a = make_run(1, 100.0, [(101.0, disp(1, 0)), (102.0, disp(2, 0)), (103.0, seal(2, 0))])
    b = make_run(2, 110.0, [(111.0, restore("/elsewhere", 1)), (112.0, resume(1, 0))])
    [stop] = rt.restore_costs(a + b)
    assert (stop.resumed, stop.restarted, stop.redone) == (None, 0, None)
    legend = _stop_legend(rt.timeline_html(a + b))
    assert legend == {"resumed": "n/a", "restarted": "0", "redone": "n/a"}


def test_the_legend_sums_the_figures_of_every_stop() -> None:
    # Two stops, each judged by its own capture: 2 + 1 resumed, 0 + 2 redone.
    a = make_run(
        1,
        100.0,
        [
            (140.0, disp(2, 0)),
            (151.0, snapshot(2, "/s/1", 150.0)),
            (155.0, seal(2, 0)),
            (160.0, disp(1, 0)),
            (170.0, step(2)),
        ],
    )
    b = make_run(
        2,
        200.0,
        [
            (210.0, restore("/s/1", 2)),
            (215.0, restored(2)),
            (216.0, resume(1, 0)),
            (217.0, resume(2, 0)),
            (230.0, snapshot(3, "/s/2", 229.0)),
            (235.0, seal(2, 0)),
            (240.0, disp(3, 0)),
            (245.0, seal(3, 0)),
            (250.0, step(3)),
        ],
    )
    c = make_run(
        3, 300.0, [(310.0, restore("/s/2", 3)), (311.0, restored(3)), (312.0, resume(1, 0))]
    )
    stops = rt.restore_costs(a + b + c)
    assert [(s.resumed, s.restarted, s.redone) for s in stops] == [(2, 0, 0), (1, 0, 2)]
    legend = _stop_legend(rt.timeline_html(a + b + c))
    assert legend == {"resumed": "3", "restarted": "0", "redone": "2"}


def test_the_document_says_the_same_per_attempt(example_stop: Any) -> None:
    doc = rt.timeline_document(rt.read(EXAMPLE))
    args = [e["args"] for e in doc["traceEvents"] if e["ph"] == "b"]
    assert sum("redone" in a for a in args) == example_stop.redone
    fates = [a["after_stop"].split(" by ")[0] for a in args if "after_stop" in a]
    assert fates.count("resumed") == example_stop.resumed
    assert fates.count("restarted") == example_stop.restarted


def test_merged_runs_mark_it_too() -> None:
    # Too many attempts to draw one by one: the marks are still drawn.
    events = td.many_attempts(12_000)
    page = rt.timeline_html(events)
    [stop] = rt.restore_costs(events)
    assert "merged per pixel column" in page
    assert page.count('class="f-lost"') > 0 and stop.redone
    legend = _legend(page)
    assert (legend["resumed"], legend["restarted"], legend["redone"]) == (
        stop.resumed,
        stop.restarted,
        stop.redone,
    )
    ends = [t for t in _svg_titles(page, "f-resumed") if t.startswith("resumed by")]
    assert len(ends) == stop.resumed
    assert len(_svg_titles(page, "f-restarted")) == stop.restarted


# --- labels ---------------------------------------------------------------------------


def _css(page: str) -> dict[str, dict[str, str]]:
    """The page's CSS rules for single classes: class -> property -> value."""
    rules: dict[str, dict[str, str]] = {}
    for names, body in re.findall(r"([.\w,-]+)\{([^}]*)\}", page):
        for name in names.split(","):
            if name.startswith(".") and name[1:].replace("-", "").isalnum():
                props = dict(p.split(":", 1) for p in body.split(";") if ":" in p)
                rules.setdefault(name[1:], {}).update(props)
    return rules


def _label_boxes(page: str) -> list[tuple[str, float, float, float, float]]:
    """Each SVG text's box, estimated small: a box that meets another is an overprint.

    0.5 em per character and 0.7 em of height are less than any sans-serif
    font takes, so two boxes that meet here overlap on every screen.
    """
    css = _css(page)
    out = []
    for attrs, text in re.findall(r"<text ([^>]*)>([^<]*)</text>", page):
        a = dict(re.findall(r'([\w-]+)="([^"]*)"', attrs))
        rule = css.get(a.get("class", ""), {})
        size = float(rule.get("font-size", "16px").removesuffix("px"))
        anchor = a.get("text-anchor", rule.get("text-anchor", "start"))
        x, y = float(a["x"]), float(a["y"])
        width = 0.5 * size * len(text)
        left = {"middle": x - width / 2, "end": x - width}.get(anchor, x)
        out.append((text, left, y - 0.7 * size, left + width, y))
    return out


def _overlaps(
    boxes: list[tuple[str, float, float, float, float]],
) -> Iterator[tuple[str, str]]:
    for i, (ta, l1, t1, r1, b1) in enumerate(boxes):
        for tb, l2, t2, r2, b2 in boxes[i + 1 :]:
            if l1 < r2 and l2 < r1 and t1 < b2 and t2 < b1:
                yield ta, tb


PAGES = {
    # steps half a second apart, a step where the stop's label goes, a restore
    "crowded": td.crowded,
    # the shipped example
    "example": lambda: list(rt.read(EXAMPLE)),
    # every kind of event and outcome
    "every-kind": td.every_kind,
    # too many to draw apart, steps every few minutes
    "many": lambda: td.many_attempts(12_000),
}


@pytest.mark.parametrize("name", PAGES)
def test_no_label_overprints_another(name: str) -> None:
    boxes = _label_boxes(rt.timeline_html(PAGES[name]()))
    assert len(boxes) > 10
    assert list(_overlaps(boxes)) == []


def test_the_crowded_page_keeps_the_labels_that_fit() -> None:
    texts = [b[0] for b in _label_boxes(rt.timeline_html(td.crowded()))]
    assert "stop 1" in texts and "restore 27.0 s" in texts
    # Every other step of the twelve close ones, and the ones apart.
    steps = [t for t in texts if t.isdigit()]
    assert {"1", "12", "20"} <= set(steps) and 5 <= len(steps) < 12 + 2 + 1 + 5


def test_the_check_finds_an_overprint() -> None:
    # The check above is only worth what it can find: two step numbers drawn
    # 4 px apart, as the page drew "10" and "11" before.
    page = rt.timeline_html(td.crowded())
    bad = page.replace(
        "</svg>",
        '<text x="300" y="50" class="steplab">10</text>'
        '<text x="304" y="50" class="steplab">11</text></svg>',
    )
    assert ("10", "11") in list(_overlaps(_label_boxes(bad)))


@pytest.fixture
def browser() -> Iterator[Page]:
    page = Page()
    yield page
    page.close()


@needs_chromium
def test_no_label_overprints_another_in_a_browser(browser: Page, tmp_path: Path) -> None:
    # The boxes Chromium lays the text out in, not an estimate.
    for name in ("crowded", "example"):
        page = tmp_path / f"{name}.html"
        page.write_text(rt.timeline_html(PAGES[name]()))
        browser.load(page)
        boxes = json.loads(
            browser.evaluate(
                "JSON.stringify([...document.querySelectorAll('svg text')].map(t => {"
                "const r = t.getBoundingClientRect();"
                "return [t.textContent, r.left + 0.5, r.top + 0.5, r.right - 0.5, r.bottom - 0.5]"
                "}))"
            )
        )
        assert len(boxes) > 10
        assert list(_overlaps([tuple(b) for b in boxes])) == [], name  # type: ignore[misc]


# --- reasons --------------------------------------------------------------------------


class _Visible(HTMLParser):
    """The text a reader sees without hovering: no attributes, no SVG titles."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._in_title = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in_title += tag == "title"

    def handle_endtag(self, tag: str) -> None:
        self._in_title -= tag == "title"

    def handle_data(self, data: str) -> None:
        if not self._in_title:
            self.parts.append(data)


def test_why_a_figure_is_na_is_on_the_card_not_only_in_a_title() -> None:
    # B restores a path A never published and never finishes its restore.
    events = [
        *make_run(1, 100.0, [(101.0, disp(1, 0)), (102.0, seal(1, 0)), (103.0, step(1))]),
        *make_run(2, 110.0, [(111.0, restore("/never-published", 1))], closed=112.0),
    ]
    [stop] = rt.restore_costs(events)
    assert {"captured_at", "restore_s"} <= set(stop.reasons)
    seen = _Visible()
    seen.feed(rt.timeline_html(events))
    text = " ".join(seen.parts)
    for figure, why in stop.reasons.items():
        assert f"n/a: {why}" in text, figure


# --- the run labels in the gutter -------------------------------------------------------

ELLIPSIS = "\u2026"

GUTTER = {
    # the review's case: drawn whole, it ran about 57 px into the plot
    "ec2-host": ("ip-10-0-123-234.ec2.internal", 1000),
    # many times the gutter's width
    "very-long-host": ("h" * 300, 1000),
    # a pid of 19 digits
    "long-pid": ("node-1", 2**62),
    # letters the width table does not hold, so counted wide
    "cyrillic-host": ("узел-" * 8, 1000),
}


def _named(host: str, pid: int) -> list[rt.Event]:
    run = make_run(1, 100.0, [(101.0, disp(1, 0)), (102.0, seal(1, 0))], pid=pid)
    return [msgspec.structs.replace(run[0], host=host), *run[1:]]


def _gutter(page: str) -> tuple[str, list[tuple[float, str, str]]]:
    """The run's hover title and its gutter lines (baseline, class, text)."""
    m = re.search(r"<g><title>([^<]*)</title>((?:<text [^>]*>[^<]*</text>)+)</g>", page)
    assert m is not None
    lines = re.findall(r'<text x="8" y="([\d.]+)" class="(\w+)">([^<]*)</text>', m.group(2))
    return unescape(m.group(1)), [(float(y), c, unescape(t)) for y, c, t in lines]


@pytest.mark.parametrize("case", GUTTER)
def test_run_labels_stay_left_of_the_plot(case: str) -> None:
    host, pid = GUTTER[case]
    page = rt.timeline_html(_named(host, pid))
    css = _css(page)
    title, lines = _gutter(page)
    assert len(lines) == 4
    for y, cls, text in lines:
        size = float(css[cls]["font-size"].removesuffix("px"))
        box = text_box(8, y, text, size, "start", bold=css[cls].get("font-weight") == "600")
        assert box[2] <= LEFT, (text, box)
    # What is cut short ends in an ellipsis, and is whole in the title.
    for (_, _, text), whole in zip(lines, (f"run 1 · {host}", f"pid {pid} · "), strict=False):
        assert text.startswith(whole) or (
            text.endswith(ELLIPSIS) and whole.startswith(text[:-1]) and len(text) > 8
        ), text
    assert f"host {host}, pid {pid}" in title


@needs_chromium
def test_run_labels_stay_left_of_the_plot_in_a_browser(browser: Page, tmp_path: Path) -> None:
    for case in ("ec2-host", "long-pid", "cyrillic-host"):
        page = tmp_path / f"{case}.html"
        page.write_text(rt.timeline_html(_named(*GUTTER[case])))
        browser.load(page)
        edges = json.loads(
            browser.evaluate(
                "JSON.stringify({plot: document.querySelector('rect.band')"
                ".getBoundingClientRect().left, text: [...document.querySelectorAll("
                "'svg text[x=\"8\"]')].map(t => t.getBoundingClientRect().right)})"
            )
        )
        assert len(edges["text"]) == 4
        assert max(edges["text"]) < edges["plot"], (case, edges)


# --- notes ----------------------------------------------------------------------------

# How many notes the page lists (rollout_trace._timeline.page.NOTES_SHOWN).
NOTES_SHOWN = 20


def _read_twice(runs: int) -> list[rt.Event]:
    """``runs`` runs, the second restoring the first, every line given twice: a note each."""
    events: list[rt.Event] = []
    for n in range(1, runs + 1):
        timed = [(100.0 * n + 1, disp(n, 0)), (100.0 * n + 2, seal(n, 0))]
        if n == 1:
            timed.append((103.0, snapshot(1, "/s", 102.5)))
        if n == 2:
            timed.insert(0, (200.5, restore("/s", 1)))
        events += make_run(n, 100.0 * n, timed)
    return events + events


@pytest.mark.parametrize(
    ("runs", "listed"),
    [
        (2, 2),  # every note listed
        (NOTES_SHOWN + 3, NOTES_SHOWN),  # the first ones, and how many more
    ],
)
def test_the_cost_notes_are_listed_under_the_stops(runs: int, listed: int) -> None:
    events = _read_twice(runs)
    analysis = analyze(events)
    [stop] = analysis.stops
    assert stop.stopped_run is not None and len(analysis.notes) == runs
    page = rt.timeline_html(events)
    seen = _Visible()
    seen.feed(page)
    text = " ".join(seen.parts)
    shown = [n.text for n in analysis.notes if n.text in text]
    assert shown == [n.text for n in analysis.notes[:listed]]
    assert (f"and {runs - listed} more" in text) == (runs > listed)
    # Under the stops: after the last stop's card.
    assert page.index('id="stop-1"') < page.index(analysis.notes[0].text)
    from rollout_trace._timeline.page import NOTES_SHOWN as LISTED

    assert LISTED == NOTES_SHOWN
