"""Times at the ends of the float range: valid JSON and a page that renders, no traceback."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from perfetto_rules import check_trace_events
from scenario import disp, make_run, restore, restored, resume, seal, snapshot, step, write

import rollout_trace as rt
from rollout_trace._cli.main import main
from rollout_trace._timeline.document import MAX_US

BIG = sys.float_info.max  # 1.7976931348623157e308


def _one_run(times: tuple[float, float, float]) -> list[rt.Event]:
    opened, dispatched, sealed = times
    return make_run(1, opened, [(dispatched, disp(1, 0)), (sealed, seal(1, 0))])


def _stop_across_the_range() -> list[rt.Event]:
    # Run A near the bottom of the range, run B near the top: every time
    # difference between them (downtime, the stop's x on the page) overflows.
    a = make_run(
        1,
        -1e308,
        [
            (-1e308, disp(1, 0)),
            (-1e308, step(1)),
            (-1e308, snapshot(1, "/s1", -1e308)),
            (-1e308, disp(2, 0)),
        ],
    )
    b = make_run(
        2,
        1.7e308,
        [(1.7e308, restore("/s1", 1)), (BIG, restored(1)), (BIG, resume(2, 0)), (BIG, seal(2, 0))],
        closed=BIG,
    )
    return a + b


CASES = {
    # the case: -1e308 and 1e308 and 1.7e308 in one run
    "both-ends": _one_run((-1e308, 1e308, 1.7e308)),
    # the widest span a float holds, end to end
    "widest": _one_run((-BIG, 0.0, BIG)),
    # all at the top: the span is small, the times are not
    "all-at-the-top": _one_run((1.7e308, 1.7e308, BIG)),
    # a stop and restore across the whole range
    "stop-across": _stop_across_the_range(),
}


def _no_constant(name: str) -> Any:
    raise AssertionError(f"{name} is not JSON")


@pytest.mark.parametrize("case", CASES)
def test_document_is_plain_json_with_finite_times(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t.json"
    assert main(["timeline", str(write(tmp_path / "t.jsonl", CASES[case])), "-o", str(out)]) == 0
    doc = json.loads(out.read_text(), parse_constant=_no_constant)
    drawn = [e for e in doc["traceEvents"] if e["ph"] != "M"]
    assert any(e.get("cat") == "attempt" for e in drawn)
    # Within what a float holds in whole microseconds, and what the importer's
    # int64 nanoseconds hold; every try's end not before its start.
    check_trace_events(doc)
    for e in drawn:
        assert isinstance(e["ts"], float | int) and 0 <= e["ts"] <= MAX_US < BIG, e
        if e["ph"] == "X":
            assert isinstance(e["dur"], float | int) and 0 <= e["dur"] <= MAX_US, e
    assert "Traceback" not in capsys.readouterr().err


class _Page(HTMLParser):
    """The page's SVG numbers and the text a reader sees."""

    NUMERIC = frozenset({"x", "y", "width", "height", "x1", "y1", "x2", "y2", "cx", "cy", "r"})

    def __init__(self) -> None:
        super().__init__()
        self.numbers: list[str] = []
        self.paths: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in self.NUMERIC and value is not None:
                self.numbers.append(value)
            elif name == "d" and value is not None:
                self.paths.append(value)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


@pytest.mark.parametrize("case", CASES)
def test_page_draws_with_finite_coordinates(case: str, tmp_path: Path) -> None:
    out = tmp_path / "t.html"
    assert main(["timeline", str(write(tmp_path / "t.jsonl", CASES[case])), "-o", str(out)]) == 0
    page = _Page()
    page.feed(out.read_text())
    assert page.numbers
    for value in page.numbers:
        assert math.isfinite(float(value)), value
    for d in page.paths:
        for number in re.findall(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|nan|inf", d):
            assert math.isfinite(float(number)), d
    text = " ".join(page.text)
    assert "nan" not in text.split() and "inf" not in text.split()


def test_figures_past_the_range_are_na_with_the_reason_on_the_page(tmp_path: Path) -> None:
    out = tmp_path / "t.html"
    trace = write(tmp_path / "t.jsonl", CASES["stop-across"])
    assert main(["timeline", str(trace), "-o", str(out)]) == 0
    [stop] = rt.restore_costs(rt.read(trace))
    assert stop.downtime_s is None and "downtime_s" in stop.reasons
    page = _Page()
    page.feed(out.read_text())
    text = " ".join(page.text)
    assert f"n/a: {stop.reasons['downtime_s']}" in text


def test_a_real_process_writes_both_without_a_traceback(tmp_path: Path) -> None:
    trace = write(tmp_path / "t.jsonl", CASES["both-ends"])
    for suffix in (".json", ".html"):
        proc = subprocess.run(
            [sys.executable, "-m", "rollout_trace", "timeline", str(trace), "-o", f"t{suffix}"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr
        assert (tmp_path / f"t{suffix}").stat().st_size > 0
