"""The timeline's work grows with what it draws: runs, labels and marks, never their square.

No timings: work is counted (lines run, checks made, bytes held), and growth
is compared between a trace set and one four times its size, with a factor
far from both linear (4) and quadratic (16) growth.
"""

from __future__ import annotations

import gc
import random
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from scenario import disp, make_run, restore, restored, run_id, snapshot, step

import rollout_trace as rt
from rollout_trace._timeline import labels
from rollout_trace._timeline.document import document_of
from rollout_trace._timeline.model import Timeline, build_timeline
from rollout_trace._timeline.page import html_of

TIMELINE = str(Path(labels.__file__).parent)
# Growth allowed when the trace set is four times larger: linear is 4.
GROWTH = 6


def _stopped_runs(runs: int, in_flight: int) -> list[rt.Event]:
    """``runs`` runs, each restoring the one before, each stopped with tries in flight.

    Every try in flight at a stop is marked (restarted), and its mark names
    the run that restored it; every run has a step and a snapshot to label.
    """
    events: list[rt.Event] = []
    for k in range(runs):
        t = 1000.0 + 100.0 * k
        timed: list[tuple[float, rt.Event]] = []
        if k:
            timed += [(t + 1, restore(f"/s{k - 1}", k)), (t + 2, restored(k))]
        timed += [(t + 3, step(k)), (t + 4, snapshot(k, f"/s{k}", t + 3.5))]
        timed += [(t + 5 + i * 0.01, disp(i, 0)) for i in range(in_flight)]
        events += make_run(k + 1, t, timed)
    return events


def _lines_run(draw: Callable[[], Any]) -> int:
    """How many lines of the timeline package run while ``draw`` runs."""
    count = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        count += event == "line"
        return local

    def calls(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename.startswith(TIMELINE) else None

    sys.settrace(calls)
    try:
        draw()
    finally:
        sys.settrace(None)
    return count


@pytest.mark.parametrize(
    "render",
    [
        document_of,  # every marked try names the run that restored it
        html_of,  # so does its glyph's title, and every label is placed
    ],
)
def test_drawing_grows_linearly_with_the_runs(render: Callable[[Timeline], Any]) -> None:
    small = build_timeline(_stopped_runs(40, 8))
    large = build_timeline(_stopped_runs(160, 8))
    assert small.stops and large.stops
    marked = sum(a.fate is not None for r in large.runs for a in r.attempts)
    assert marked == 159 * 8  # the look-ups to count are there
    few, many = _lines_run(lambda: render(small)), _lines_run(lambda: render(large))
    assert 3 * few < many < GROWTH * few, (few, many)


def _count_meets(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    meet = labels._meet

    def counted(a: labels.Box, b: labels.Box) -> bool:
        calls[0] += 1
        return meet(a, b)

    monkeypatch.setattr(labels, "_meet", counted)
    return calls


def test_a_label_is_checked_against_its_neighbours_not_every_label(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each run adds its gutter lines, a step number and a stop label: with
    # four times the runs, four times the checks, not sixteen.
    small, large = _stopped_runs(50, 2), _stopped_runs(200, 2)
    calls = _count_meets(monkeypatch)
    rt.timeline_html(small)
    few = calls[0]
    rt.timeline_html(large)
    many = calls[0] - few
    assert few > 0 and many < GROWTH * few, (few, many)


def _boxes(shape: str, n: int) -> list[labels.Box]:
    if shape == "column":
        return [(8.0, 20.0 * i, 150.0, 20.0 * i + 12) for i in range(n)]
    if shape == "rows":
        across = 34  # as many as fit across the chart
        return [
            (
                30.0 * (i % across),
                20.0 * (i // across),
                30.0 * (i % across) + 20,
                20.0 * (i // across) + 12,
            )
            for i in range(n)
        ]
    rng = random.Random(n)
    out = []
    for _ in range(n):
        x, y = rng.uniform(0, 1040), rng.uniform(0, 4000)
        out.append((x, y, x + rng.uniform(5, 120), y + rng.uniform(8, 16)))
    return out


@pytest.mark.parametrize(
    "shape",
    [
        "column",  # run names down the gutter, none meeting another
        "rows",  # labels along lines across the chart, none meeting another
        "scatter",  # anywhere, many meeting
    ],
)
def test_a_layout_checks_few_boxes_and_finds_every_meeting(
    shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    boxes = _boxes(shape, 1500)
    layout = labels.Layout()
    calls = _count_meets(monkeypatch)
    placed = [layout.place([b]) == 0 for b in boxes]
    assert calls[0] < 10 * len(boxes), calls[0]
    # The same answers as checking every placed box.
    kept: list[labels.Box] = []
    for box, was in zip(boxes, placed, strict=True):
        free = not any(labels._meet(box, b) for b in kept)
        assert was == free, box
        if free:
            kept.append(box)
    assert (sum(placed) == len(boxes)) == (shape != "scatter")


# --- memory -----------------------------------------------------------------------


MARK_EVENTS = 60_000
# Bytes a step, weights or group event may keep (a Mark object took ~400).
BYTES_PER_MARK = 160


def _mark_events(n: int) -> Iterator[rt.Event]:
    """One run of group events, weight syncs and steps, made one at a time, as read."""
    rid = run_id(7)
    seq = 0

    def stamp(ev: rt.Event) -> rt.Event:
        nonlocal seq
        ev.time, ev.run_id, ev.seq = 100.0 + seq * 1e-3, rid, seq
        seq += 1
        return ev

    yield stamp(rt.TraceOpened(sdk_version="0", pid=1, host="node-1"))
    for i in range(n // 4):
        # Each event has its own strings, as decoded lines have.
        yield stamp(
            rt.GroupReserved(group_id=f"group-{i:08d}", prompt_id=i, size=8, weight_version=i)
        )
        yield stamp(rt.GroupAdmitted(group_id=f"group-{i:08d}", prompt_id=i))
        yield stamp(rt.WeightsSynced(weight_version=i))
        yield stamp(rt.StepTrained(step=i, group_ids=[f"group-{i:08d}"]))


def test_marks_are_kept_in_rows_of_a_few_dozen_bytes() -> None:
    gc.collect()
    tracemalloc.start()
    try:
        tl = build_timeline(_mark_events(MARK_EVENTS))
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < BYTES_PER_MARK * MARK_EVENTS, held / MARK_EVENTS
    # And every one of them is still in the document.
    drawn = [e for e in document_of(tl)["traceEvents"] if e.get("cat") in ("group", "weights")]
    assert len(drawn) == MARK_EVENTS // 4 * 3
    assert tl.runs[0].marks.count("step") == MARK_EVENTS // 4
