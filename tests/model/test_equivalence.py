"""The model (``rollout_trace._model``) beside the folds not yet replaced: the same answers.

The stops and notes are the model's own now (``cost`` and ``restore_costs``
read it; the old cost fold is compared with it by ``tests/differential``,
against the commit before the switch). Here they must come out the same in
every layout of a set (NaN and null equal), and the model's tries must equal the
rows ``rt.attempts`` writes, except for one intended difference (D1): a try
whose attempt started again before any end is *superseded*, not open. Rows
stay the same (``unended``, no ``ended_at``); only openness differs, and the
tests compute where from the old rows themselves.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import math
import random
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import pytest
from analysis.test_analysis import SCENARIOS, trace_sets
from analysis.test_any_order import CONFLICTS, NOTES, _conflict_set, _long_stop, _pair
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scenario import (
    disp,
    interleave,
    make_run,
    restore,
    restored,
    resume,
    seal,
    snapshot,
    step,
    write,
)
from timeline_data import crowded, every_kind, many_attempts

import rollout_trace as rt
from rollout_trace._cli.main import main
from rollout_trace._model import Model as TraceSet
from rollout_trace._model import analyze
from rollout_trace._timeline.model import build_timeline

# Columns the model's try rows share with today's attempts table; the
# trained step moves with lineage in a later step.
SHARED = (
    "run",
    "run_id",
    "host",
    "pid",
    "group_id",
    "prompt_id",
    "generation_index",
    "attempt",
    "started_at",
    "ended_at",
    "duration_s",
    "outcome",
    "reason",
    "weight_version",
    "resumed_turn",
    "fate",
    "stop",
    "lost_s",
)


def _same(a: Any, b: Any) -> bool:
    """Equal, with NaN equal to NaN and exact types for numbers."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _stop_doc(stops: list[Any], notes: list[Any]) -> dict[str, Any]:
    """Every field of every stop (figures, reasons, path, source of C) and the notes."""
    return {
        "stops": [msgspec.to_builtins(s) | {"reasons": s.reasons} for s in stops],
        "notes": [msgspec.to_builtins(n) for n in notes],
    }


def _in_order(events: list[Any]) -> list[Any]:
    """The set's lines once each, run by run in seq order: the plainest layout."""
    once = {(e.run_id, e.seq, msgspec.json.encode(e)): e for e in events}
    return sorted(once.values(), key=lambda e: (e.run_id, e.seq))


def check_stops(events: list[Any]) -> TraceSet:
    """The model's stops and notes in this layout equal those of the plainest one,
    field by field (but the note that lines were read twice)."""
    ts = analyze(events)
    plain = analyze(_in_order(events))
    new = _stop_doc(ts.stops, [n for n in ts.notes if n.kind != "read_twice"])
    assert _same(new, _stop_doc(plain.stops, plain.notes)), new
    assert _same(
        [s.to_dict() for s in ts.stops], [s.to_dict() for s in rt.restore_costs(list(events))]
    )
    return ts


def superseded(rows: list[dict[str, Any]]) -> list[bool]:
    """D1 from today's rows: an unended started row with no end, followed in its
    run by another start of the same (sibling, attempt)."""
    out = []
    for i, r in enumerate(rows):
        key = (r["run_id"], r["prompt_id"], r["generation_index"], r["attempt"])
        later = any(
            (o["run_id"], o["prompt_id"], o["generation_index"], o["attempt"]) == key
            and o["started_at"] is not None
            for o in rows[i + 1 :]
        )
        out.append(
            r["outcome"] == "unended"
            and r["ended_at"] is None
            and r["started_at"] is not None
            and later
        )
    return out


def check_tries(events: list[Any], ts: TraceSet | None = None) -> int:
    """The model's tries equal today's attempts rows; openness differs only by D1.

    Returns how many tries were superseded (the rows where D1 applies).
    """
    ts = analyze(events) if ts is None else ts
    old = [msgspec.to_builtins(r) for r in rt.attempts(list(events))]
    new = [msgspec.to_builtins(r) for r in ts.tries]
    assert len(new) == len(old)
    for n, o in zip(new, old, strict=True):
        assert _same({k: n[k] for k in SHARED}, {k: o[k] for k in SHARED}), (n, o)
    # Today a try is open when it started and no end event closed it
    # (`end_seq < 0`); the model leaves out the superseded ones (D1).
    timeline = build_timeline(list(events))
    old_open = [a.started and a.end_seq < 0 for r in timeline.runs for a in r.attempts]
    d1 = superseded(old)
    new_open = [r["end"] == "open" for r in new]
    assert new_open == [o and not s for o, s in zip(old_open, d1, strict=True)]
    assert [r["end"] == "superseded" for r in new] == d1
    return sum(d1)


def _flat(runs: Any) -> list[Any]:
    """A scenario's events: a list of events, or runs of them."""
    return [e for r in runs for e in (r if isinstance(r, (list, tuple)) else [r])]


# --- the oracle's sets: SCENARIOS, the note cases, and random trace sets ----------


@pytest.mark.parametrize(("runs", "expected"), [p.values for p in SCENARIOS])
def test_every_scenario_gives_todays_stops_and_tries(runs: Any, expected: Any) -> None:
    events = _flat(runs)
    ts = check_stops(events)
    check_tries(events, ts)


@pytest.mark.parametrize(("runs", "kinds"), [p.values for p in NOTES])
def test_every_note_case_gives_todays_notes(runs: Any, kinds: list[str]) -> None:
    events = _flat(runs)
    ts = check_stops(events)
    assert [n.kind for n in ts.notes if n.kind != "read_twice"] == kinds
    check_tries(events, ts)


def test_a_long_stop_in_any_order_gives_todays_stops() -> None:
    a, b = _long_stop()
    events = a + b
    for order in (events, events[::-1], random.Random(3).sample(events, len(events))):
        check_stops(order)


@pytest.mark.parametrize(
    "events",
    [many_attempts(300), every_kind(), crowded()],
    ids=["many_attempts", "every_kind", "crowded"],
)
def test_timeline_sets_give_todays_stops_and_tries(events: list[Any]) -> None:
    ts = check_stops(events)
    check_tries(events, ts)


def test_the_issue_case_is_one_superseded_try_not_an_open_one() -> None:
    # Issue #26: dispatch, resume of the same attempt, seal. Today the first
    # try is open (a stall); in the model it is superseded.
    run = make_run(
        1,
        100.0,
        [(101.0, disp(2, 0)), (102.0, resume(2, 0)), (103.0, seal(2, 0)), (110.0, step(1))],
    )
    ts = analyze(run)
    assert [r.end for r in ts.tries] == ["superseded", "sealed"]
    assert [r.outcome for r in ts.tries] == ["unended", "sealed"]
    assert check_tries(run, ts) == 1


@settings(
    max_examples=150,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(runs=trace_sets(), seed=st.integers(0, 2**16))
def test_random_trace_sets_in_any_layout_give_todays_answers(
    runs: list[list[rt.Event]], seed: int
) -> None:
    every = [e for r in runs for e in r]
    shuffled = random.Random(seed).sample(every, len(every))
    layouts = {
        "one": every,
        "interleaved": interleave(runs, seed),
        "shuffled": shuffled,
        "read twice": every + shuffled,
    }
    for events in layouts.values():
        ts = check_stops(events)
        check_tries(events, ts)


# --- the command line: `cost --json` on files, and on the demo's output ------------


def _cost_json(paths: list[str]) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        main(["cost", "--json", *paths])
    doc: dict[str, Any] = json.loads(out.getvalue())
    return doc


def _model_json(ts: TraceSet) -> dict[str, Any]:
    """``cost --json``'s document, built from the model."""
    return {
        "stops": [s.to_dict() for s in ts.stops],
        "notes": [msgspec.to_builtins(n) for n in ts.notes],
        "reasons": [
            {
                "stopped_run": s.stopped_run,
                "restored_run": s.restored_run,
                "figure": figure,
                "reason": reason,
            }
            for s in ts.stops
            for figure, reason in s.reasons.items()
        ],
    }


@settings(
    max_examples=15,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(runs=trace_sets())
def test_cost_json_on_files_equals_the_models(runs: list[list[rt.Event]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        files = [str(write(folder / f"run-{i}.jsonl", r)) for i, r in enumerate(runs)]
        # One run's file twice, as two sinks would write it.
        files.append(str(write(folder / "again.jsonl", runs[0])))
        assert _same(_model_json(analyze(files)), _cost_json(files))


def test_the_demo_and_the_shipped_example_give_todays_answers(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["demo", "--out", str(out)]) == 0
    example = Path(__file__).parents[1] / "data" / "example"
    for folder in (out, example):
        paths = sorted(str(p) for p in folder.glob("*.jsonl"))
        assert paths
        ts = analyze(paths)
        assert ts.stops
        assert _same(_model_json(ts), _cost_json(paths))
        events = list(rt.read(paths))
        check_stops(events)
        check_tries(events, ts)


# --- copies and versions: what `summary --json` counts today ---------------------


def _summary_json(paths: list[str]) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(["summary", "--json", *paths])
    doc: dict[str, Any] = json.loads(out.getvalue())
    return doc


def check_copies(paths: list[str]) -> None:
    """Per run: copies in one file, copies across files, versions and events as summary has them."""
    ts = analyze(paths)
    runs = {r["run_id"]: r for r in _summary_json(paths)["runs"]}
    assert sorted(runs) == sorted(r.run_id for r in ts.runs)
    for run in ts.runs:
        ev, old = run.events, runs[run.run_id]
        assert ev.same_file == old["duplicate_seqs"], run.run_id
        assert ev.other_file == old["read_twice"], run.run_id
        assert len(ev.versions) == old["conflicts"], run.run_id
        assert len(ev) == old["events"], run.run_id
        gaps = [[a[1] + 1, b[0] - 1] for a, b in itertools.pairwise(ev.ranges())]
        assert gaps == [list(g) for g in old["seq_gaps"]], run.run_id
        assert (ev.min_time, ev.max_time) == (old["first_time"], old["last_time"])
        assert ts.bad_lines(run.run_id) == (old["torn_lines"], old["invalid_lines"])


@settings(
    max_examples=10,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(runs=trace_sets(), seed=st.integers(0, 2**16))
def test_copies_versions_and_gaps_are_summarys(runs: list[list[rt.Event]], seed: int) -> None:
    rng = random.Random(seed)
    every = [e for r in runs for e in r]
    # A gap: one line of the last run left out.
    every.remove(runs[-1][len(runs[-1]) // 2])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        one = write(folder / "one.jsonl", every)
        # Some lines twice in one file, and the whole set again in another.
        twice = write(folder / "twice.jsonl", every + rng.sample(every, len(every) // 3))
        # A bad line of the first run, and a torn last line of the last.
        with one.open("ab") as f:
            f.write(
                b'{"event":"attempt_sealed","time":1.0,"run_id":"%s","seq":2}\n'
                % (runs[0][0].run_id.encode())
            )
            f.write(
                b'{"event":"step_trained","time":1.0,"run_id":"%s","seq":9'
                % (runs[-1][0].run_id.encode())
            )
        paths = [str(one), str(twice)]
        check_copies(paths)
        ts = analyze(paths)
        assert ts.bad_lines(runs[0][0].run_id)[1] == 1
        assert ts.bad_lines(runs[-1][0].run_id)[0] == 1


@pytest.mark.parametrize(("files", "seqs"), [p.values for p in CONFLICTS])
def test_versions_are_summarys_conflicts(tmp_path: Path, files: Any, seqs: list[int]) -> None:
    paths = [str(p) for p in _conflict_set(tmp_path, files)]
    check_copies(paths)
    assert [v for r in analyze(paths).runs for v in r.events.versions] == seqs


# --- marks and restores: what the timeline draws today ---------------------------


@pytest.mark.parametrize(
    "events",
    [many_attempts(200), every_kind(), crowded()],
    ids=["many_attempts", "every_kind", "crowded"],
)
def test_marks_and_restores_are_the_timelines(events: list[Any]) -> None:
    ts = analyze(events)
    timeline = build_timeline(list(events))
    assert [r.run_id for r in ts.runs] == [r.run_id for r in timeline.runs]
    for run, line in zip(ts.runs, timeline.runs, strict=True):
        assert [run.events.seq[i] for i in run.marks] == sorted(m.seq for m in line.marks)
        assert [msgspec.to_builtins(r) for r in run.restores] == [
            {"started": r.started, "finished": r.finished, "path": r.path, "step": r.step}
            for r in line.restores
        ]


# --- edges: float range, huge numbers, seqs no tracer gives, times not finite ------


def _edges() -> list[Any]:
    big, e = 1.7e308, 1e308
    snap = make_run(
        1,
        1.0,
        [(2.0, snapshot(2, "/s/1", 2.0)), (3.0, disp(1, 0)), (4.0, disp(2, 0)), (big, step(3))],
    )
    edge_b = make_run(2, big, [(big, restore("/s/1", 2)), (big, restored(2))])
    overflow = [
        *make_run(
            1, 1.0, [(1.5, snapshot(1, "/s/1", 1.5)), (2.0, disp(1, 0)), (0.95 * e, step(3))]
        ),
        *make_run(
            2,
            0.96 * e,
            [
                (0.97 * e, restore("/s/1", 1)),
                (0.98 * e, restored(1)),
                (0.99 * e, snapshot(1, "/s/2", 0.99 * e)),
                (1.0 * e, disp(2, 0)),
                (1.0 * e, disp(3, 0)),
                (1.79 * e, step(3)),
            ],
        ),
        *make_run(3, 1.795 * e, [(1.796 * e, restore("/s/2", 1)), (1.797 * e, restored(1))]),
    ]
    a, b = _pair([(160.0, disp(1, 0, 2**63)), (161.0, seal(1, 0, 2**63)), (162.0, disp(2, 0))], [])
    huge_attempt = [*a, *b]
    a, b = _pair([(160.0, disp(1, 0))], [])
    late = rt.WeightsSynced(weight_version=2)
    late.time, late.run_id, late.seq = 9000.0, a[0].run_id, 2**62
    below = rt.WeightsSynced(weight_version=2)
    below.time, below.run_id, below.seq = 50.0, a[0].run_id, -1
    edge = rt.WeightsSynced(weight_version=1)
    edge.time, edge.run_id, edge.seq = 175.0, a[0].run_id, 2**62 - 1
    bad_seqs = [late, *b, edge, below, *a]
    # A seal with no start in its run (redone_s n/a), and a time that is NaN.
    a, b = _pair([(160.0, seal(1, 0)), (165.0, disp(2, 0)), (math.nan, seal(2, 0))], [])
    unstarted = [*a, *b]
    return [[*snap, *edge_b], overflow, huge_attempt, bad_seqs, unstarted]


@pytest.mark.parametrize(
    "events", _edges(), ids=["float-edge", "overflow", "attempt-2**63", "bad-seqs", "unstarted"]
)
def test_edges_give_todays_stops_and_tries(events: list[Any]) -> None:
    ts = check_stops(events)
    check_tries(events, ts)
    check_stops(events[::-1])
