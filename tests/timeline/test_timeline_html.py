"""The timeline's HTML page: self-contained, escaped, and rendered by a real Chromium."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import timeline_data as td
from headless import CHROMIUM, Page, screenshot

import rollout_trace as rt
from rollout_trace._timeline.chart import COLOURS

EXAMPLE = Path(__file__).parents[1] / "data" / "example"
HOSTILE_GROUP = "<script>alert(1)</script>"
HOSTILE_HOST = "<img src=x onerror=\"document.title='pwned'\">"
TITLE = "rollout_trace timeline"

# Skipped only where Chromium is truly missing; CI installs it (.ci/run), so there
# a missing Chromium fails instead of skipping.
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"),
    reason="Chromium is not installed (apt-get install chromium)",
)


def hostile_page() -> str:
    return rt.timeline_html(td.every_kind(group_id=HOSTILE_GROUP, host=HOSTILE_HOST))


def test_trace_text_is_escaped() -> None:
    page = hostile_page()
    assert "<script" not in page.lower() and "<img" not in page.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=" in page


@pytest.mark.parametrize(
    "pattern",
    [
        r"<script",  # no script at all, inline or not
        r"\b(?:src|href)\s*=",  # nothing loaded: images, styles, scripts, links
        r"url\(\s*['\"]?(?:https?:|//)",  # no remote CSS resources
        r"@import",  # no imported stylesheets
    ],
)
def test_page_is_self_contained(pattern: str) -> None:
    page = rt.timeline_html(rt.read(EXAMPLE))
    assert not re.search(pattern, page, re.IGNORECASE), pattern
    assert "Content-Security-Policy" in page and "default-src 'none'" in page


def test_page_shows_attempts_marks_and_the_cost_table() -> None:
    events = td.every_kind()
    page = rt.timeline_html(events)
    cost = rt.restore_costs(events)[0]
    assert "showing all 10 attempts, one bar each" in page
    for outcome in COLOURS:
        assert f'class="o-{outcome}"' in page, outcome  # the fixture has every outcome
    assert 'class="ckpt"' in page and 'class="snap"' in page and 'class="captured"' in page
    assert 'class="restore"' in page and 'class="stop"' in page and 'fill="url(#hatch)"' in page
    assert f"downtime {cost.downtime_s:,.3f} s" in page
    rows = dict(re.findall(r"<td>(\w+)</td><td class=\"v[^\"]*\">([^<]*)</td>", page))
    # (2, 0), dispatched at 10 and open at the stop at 20, is resumed: all of it
    # is after the capture at 9.5 (10 s); (2, 1) is restarted (9 s).
    assert rows["downtime_s"] == "12.000" and rows["lost_s"] == "19.000"
    assert rows["resumed_s"] == "10.000" and rows["thrown_away_s"] == "9.000"
    assert rows["in_flight"] == "2" and rows["restarted"] == "1"


def test_many_attempts_are_merged_and_the_page_says_so() -> None:
    page = rt.timeline_html(td.many_attempts(12_000))
    note = re.search(r'id="shown">([^<]*)<', page)
    assert note is not None
    assert note.group(1).startswith("showing ") and "merged per pixel column" in note.group(1)
    # Far fewer bars than attempts.
    assert page.count("<rect") < 12_000


# --- in a real browser -------------------------------------------------------------


def _load_pillow() -> Any:
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - a test dependency (pyproject [test])
        pytest.fail("Pillow is needed to read screenshots: pip install pillow")
    return Image


def _count(png: Path, box: tuple[int, int, int, int], colour: str | None) -> int:
    """Pixels in ``box`` near ``colour``, or, for None, not near the white background."""
    image = _load_pillow().open(png).convert("RGB").crop(box)
    want = None if colour is None else tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))
    raw = image.tobytes()  # RGB triples, row by row
    n = 0
    for i in range(0, len(raw), 3):
        pixel = raw[i : i + 3]
        if want is None:
            n += sum(pixel) < 3 * 245
        else:
            n += sum(abs(a - b) for a, b in zip(pixel, want, strict=True)) < 40
    return n


@needs_chromium
def test_screenshot_is_not_blank(tmp_path: Path) -> None:
    page = tmp_path / "t.html"
    page.write_text(rt.timeline_html(rt.read(EXAMPLE)))
    png = screenshot(page, tmp_path / "t.png", (1400, 800))
    chart = (180, 140, 1060, 700)  # the chart, right of the run labels
    assert _count(png, chart, None) > 20_000  # drawn, not an empty page
    assert _count(png, chart, COLOURS["sealed"]) > 5_000  # sealed bars
    assert _count(png, chart, COLOURS["unended"]) > 200  # tries open at the stop
    # And the count can fail: an empty trace set draws no bars.
    empty = tmp_path / "e.html"
    empty.write_text(rt.timeline_html([]))
    blank = screenshot(empty, tmp_path / "e.png", (1400, 800))
    assert _count(blank, chart, COLOURS["sealed"]) == 0


@pytest.fixture
def browser() -> Iterator[Page]:
    page = Page()
    yield page
    page.close()


@needs_chromium
def test_no_requests_and_no_console_errors(browser: Page, tmp_path: Path) -> None:
    page = tmp_path / "t.html"
    page.write_text(rt.timeline_html(td.many_attempts(5_000)))
    browser.load(page)
    assert browser.requests() == [page.resolve().as_uri()]
    assert browser.problems() == []
    assert browser.evaluate("document.title") == TITLE
    # The harness sees what it must: a page that fetches and logs an error.
    bad = tmp_path / "bad.html"
    bad.write_text('<img src="http://example.invalid/x.png"><script>console.error("x")</script>')
    browser.load(bad)
    assert "http://example.invalid/x.png" in browser.requests()
    assert any("console.error" in p for p in browser.problems())


@needs_chromium
@pytest.mark.parametrize("with_csp", [True, False], ids=["as-written", "csp-removed"])
def test_injected_markup_shows_as_text(browser: Page, tmp_path: Path, with_csp: bool) -> None:
    html = hostile_page()
    if not with_csp:
        # Escaping alone must hold, without the policy's second line of defence.
        html = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", html)
        assert "Content-Security-Policy" not in html
    page = tmp_path / "x.html"
    page.write_text(html)
    browser.load(page)
    assert browser.evaluate("document.title") == TITLE
    assert browser.evaluate("document.querySelectorAll('script, img').length") == 0
    assert browser.problems() == []  # no alert() dialog, no blocked script
    text = browser.evaluate("document.body.textContent")
    assert HOSTILE_GROUP in text and HOSTILE_HOST[:18] in text
