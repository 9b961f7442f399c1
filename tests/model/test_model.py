"""The model's own rules: terms defined once, normalize in any layout, D4.

Equivalence with the old folds is in ``test_equivalence``; these pin what
the model adds or decides itself.
"""

from __future__ import annotations

import random
from typing import Any

import msgspec
from analysis.test_analysis import trace_sets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from model.test_equivalence import _same
from scenario import (
    abandon,
    disp,
    make_run,
    restore,
    restored,
    resume,
    run_id,
    seal,
    snapshot,
    step,
)

import rollout_trace as rt
from rollout_trace._model import analyze
from rollout_trace._model.runs import normalize
from rollout_trace._model.terms import (
    ABANDONED,
    DISPATCHED,
    OUTCOMES,
    REFUSED,
    RESUMED,
    SEALED,
    WEIGHTS,
    EndKind,
    outcome_of,
    same_use,
)
from rollout_trace._model.tries import pass_run
from rollout_trace._timeline.model import OUTCOMES as TIMELINE_OUTCOMES


def test_outcomes_are_the_tables_words() -> None:
    assert OUTCOMES == TIMELINE_OUTCOMES
    assert outcome_of(EndKind.SUPERSEDED, None) == outcome_of(EndKind.OPEN, None) == "unended"
    assert outcome_of(EndKind.ABANDONED, "restart") == "abandoned_restart"
    assert outcome_of(EndKind.ABANDONED, "made up") == "dropped"


def test_a_use_goes_on_in_the_group_with_a_later_attempt_or_in_another_run() -> None:
    assert same_use("g", 0, "r1", "g", 1, "r1")
    assert not same_use("g", 1, "r1", "g", 1, "r1")
    assert same_use("g", 3, "r1", "g", 0, "r2")
    assert not same_use("g", 0, "r1", "h", 1, "r1")


def _columns(ev: Any) -> tuple[Any, ...]:
    return (list(ev.seq), list(ev.time), bytes(ev.kind), list(ev.events), ev.versions)


@settings(max_examples=30, deadline=None, database=None, derandomize=True)
@given(runs=trace_sets(), seed=st.integers(0, 2**16), parts=st.integers(1, 4))
def test_normalize_of_any_split_order_or_duplication_is_the_whole(
    runs: list[list[rt.Event]], seed: int, parts: int
) -> None:
    rng = random.Random(seed)
    for run in runs:
        whole = normalize(run[0].run_id, run, [0] * len(run))
        lines = rng.sample(run, len(run)) + rng.sample(run, len(run) // 2)
        sources = [rng.randrange(parts) for _ in lines]
        got = normalize(run[0].run_id, lines, sources)
        assert _columns(got) == _columns(whole)
        assert got.repeats == len(run) // 2 == got.same_file + got.other_file
        assert len(got.ranges()) == len(whole.ranges()) == 1


def test_runs_come_in_todays_run_order() -> None:
    a = make_run(1, 100.0, [(101.0, disp(1, 0))])
    b = make_run(2, 50.0, [(51.0, disp(2, 0))])
    # No trace_opened: ordered by the time of the lowest seq.
    c = [e for e in make_run(3, 75.0, [(76.0, step(1))]) if e.seq > 0]
    events = [*a, *b, *c]
    assert [r.run_id for r in analyze(events).runs] == [run_id(2), run_id(3), run_id(1)]


def test_a_resume_of_an_open_attempt_supersedes_its_try() -> None:
    # The case and an older try still open: only the latter is open.
    run = make_run(
        1,
        100.0,
        [
            (101.0, disp(2, 0)),
            (102.0, resume(2, 0)),
            (103.0, seal(2, 0)),
            (104.0, disp(3, 0)),
            (110.0, step(1)),
        ],
    )
    ts = analyze(run)
    assert [(r.prompt_id, r.end) for r in ts.tries] == [
        (2, "superseded"),
        (2, "sealed"),
        (3, "open"),
    ]


@settings(
    max_examples=20,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(runs=trace_sets(), seed=st.integers(0, 2**16))
def test_the_model_is_the_same_in_any_layout(runs: list[list[rt.Event]], seed: int) -> None:
    every = [e for r in runs for e in r]
    base = analyze(every)
    shuffled = random.Random(seed).sample(every, len(every))
    for events in (shuffled, every + shuffled):
        ts = analyze(events)
        assert _same(
            [msgspec.to_builtins(s) for s in ts.stops], [msgspec.to_builtins(s) for s in base.stops]
        )
        assert _same(
            [msgspec.to_builtins(t) for t in ts.tries], [msgspec.to_builtins(t) for t in base.tries]
        )


ATTEMPT_EVENTS = (
    rt.AttemptDispatched,
    rt.AttemptResumed,
    rt.AttemptSealed,
    rt.AttemptRefused,
    rt.AttemptAbandoned,
)


def _paired(events: Any) -> list[tuple[int, int, bool, Any, int, int]]:
    """The tries of a run by a plain reading of the definition: each start opens a
    try of its (sibling, attempt), superseding one still open; each end closes
    the open one, or is a try of its own. (start seq, end seq, superseded, key)."""
    tries: list[list[Any]] = []
    open_: dict[tuple[Any, int, int], int] = {}
    for ev in events.events:
        if not isinstance(ev, ATTEMPT_EVENTS):
            continue
        key = (ev.prompt_id, ev.generation_index, ev.attempt)
        if isinstance(ev, (rt.AttemptDispatched, rt.AttemptResumed)):
            if key in open_:
                tries[open_[key]][2] = True
            open_[key] = len(tries)
            tries.append([ev.seq, -1, False, *key])
        elif key in open_:
            tries[open_.pop(key)][1] = ev.seq
        else:
            tries.append([-1, ev.seq, False, *key])
    return [tuple(t) for t in tries]  # type: ignore[misc]


# Attempt events of few keys, so that starts supersede and ends come twice or alone.
_MAKERS = (disp, resume, seal, lambda p, g, a: abandon(p, g, a, "restart"))
_STREAMS = st.lists(
    st.tuples(st.sampled_from(_MAKERS), st.integers(0, 1), st.integers(0, 1), st.integers(0, 1)),
    max_size=30,
).map(
    lambda picks: make_run(
        3, 100.0, [(101.0 + i, make(p, g, a)) for i, (make, p, g, a) in enumerate(picks)]
    )
)


@settings(max_examples=150, deadline=None, database=None, derandomize=True)
@given(runs=trace_sets(), stream=_STREAMS)
def test_the_pass_pairs_as_the_definition_reads(
    runs: list[list[rt.Event]], stream: list[rt.Event]
) -> None:
    for run in [*runs, stream]:
        events = normalize(run[0].run_id, run, [0] * len(run))
        tries, sib = pass_run(events)
        got = list(
            zip(
                tries.start_seq,
                tries.end_seq,
                [k == EndKind.SUPERSEDED for k in tries.end_kind],
                tries.prompt_id,
                tries.generation_index,
                tries.attempt,
                strict=True,
            )
        )
        want = _paired(events)
        assert _same(sorted(got, key=_by_first_seq), sorted(want, key=_by_first_seq))
        started = [(t[3], t[4]) for t in want if t[0] >= 0]
        assert set(sib.last_start) == set(started)


def _by_first_seq(t: tuple[Any, ...]) -> tuple[int, str]:
    return (t[0] if t[0] >= 0 else t[1], repr(t[3:]))


def test_a_run_read_from_a_file_holds_its_attempt_events_as_rows_with_one_string_per_group(
    tmp_path: Any,
) -> None:
    # Memory: an event object costs some 200 bytes, a row of the columns about 50.
    timed = [(101.0 + i, (disp if i % 2 == 0 else seal)(i // 10, i // 2 % 5)) for i in range(100)]
    timed.append(
        (
            201.0,
            rt.AttemptRefused(group_id="g", prompt_id=9, generation_index=0, attempt=0, reason="x"),
        )
    )
    lines = make_run(7, 100.0, timed, closed=300.0)
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(msgspec.json.encode(ev) + b"\n" for ev in lines))
    (run,) = analyze(str(path)).runs
    events = run.events.events
    assert len(events) == len(lines) == 103
    assert [type(ev) for ev in events.objs] == [rt.TraceOpened, rt.TraceClosed]
    assert len(events.p) == 101
    assert len({id(g) for g in events.gid}) == len(set(events.gid)) == 11
    # Each row made again is the event its line holds.
    assert list(events) == lines


def test_attempt_events_whose_fields_do_not_fit_a_column_are_held_as_they_are(
    tmp_path: Any,
) -> None:
    huge = rt.AttemptSealed(group_id="g", prompt_id=2, generation_index=0, attempt=2**70)
    lines = make_run(7, 100.0, [(101.0, disp("p-1", 0)), (102.0, disp(3, 0)), (103.0, huge)])
    for i, ev in enumerate(lines):
        path = tmp_path / f"{i}.jsonl"
        path.write_bytes(msgspec.json.encode(ev) + b"\n")
    (run,) = analyze(str(tmp_path)).runs
    assert list(run.events.events) == lines
    # One line a file: each block that holds such an event is held whole.
    held = [ev.prompt_id for ev in run.events.events.objs if hasattr(ev, "prompt_id")]
    assert held == ["p-1", 2]
    assert [list(run.tries.prompt_id), list(run.tries.attempt)] == [["p-1", 3, 2], [0, 0, 2**70]]


def test_events_of_a_frozen_class_are_taken_as_they_are() -> None:
    class Frozen(rt.Event, frozen=True, tag="model_frozen_note"):
        note: str

    lines = make_run(8, 100.0, [(101.0, disp(1, 0))])
    rid = lines[0].run_id
    lines.insert(1, Frozen(note="x", time=100.5, run_id=rid, seq=1))
    lines[2] = msgspec.structs.replace(lines[2], seq=2)
    ts = analyze(lines)
    kinds = [type(ev) for ev in ts.runs[0].events.events]
    assert kinds == [rt.TraceOpened, Frozen, rt.AttemptDispatched]
    assert len(ts.runs[0].tries) == 1


@settings(max_examples=20, deadline=None, database=None, derandomize=True)
@given(runs=trace_sets())
def test_a_field_read_from_the_columns_is_the_field_of_the_event(
    runs: list[list[rt.Event]], tmp_path_factory: Any
) -> None:
    folder = tmp_path_factory.mktemp("set")
    for n, run in enumerate(runs):
        (folder / f"{n}.jsonl").write_bytes(b"".join(msgspec.json.encode(e) + b"\n" for e in run))
    for run in analyze(str(folder)).runs:
        ev = run.events
        for name, kinds in [
            ("weight_version", (DISPATCHED, WEIGHTS)),
            ("turn", (RESUMED,)),
            ("reason", (REFUSED, ABANDONED)),
            ("prompt_id", (DISPATCHED, RESUMED, SEALED, REFUSED, ABANDONED)),
            ("group_id", (SEALED, REFUSED)),
        ]:
            at = ev.where(*kinds)
            assert ev.events.values(name, at) == [getattr(ev.events[i], name) for i in at]


def test_a_growing_model_builds_again_only_the_runs_that_gained_lines() -> None:
    # What `watch` keeps between frames: a run whose lines did not change is
    # the same Run, not built again.
    from rollout_trace._model.live import GrowingBuilder

    one = make_run(1, 100.0, [(101.0, disp(1, 0))], closed=300.0)
    two = make_run(2, 100.0, [(101.0, disp(2, 0))], closed=300.0)
    builder = GrowingBuilder()
    builder.add(one[:2], source="a")
    builder.add(two[:2], source="b")
    first = {r.run_id: r for r in builder.build().runs}
    assert builder.rebuilt == 2
    builder.add(two[2:], source="b")  # only run 2 grows
    again = {r.run_id: r for r in builder.build().runs}
    assert builder.rebuilt == 1
    assert again[run_id(1)] is first[run_id(1)]
    assert again[run_id(2)] is not first[run_id(2)] and len(again[run_id(2)].events) == len(two)


def test_a_run_ends_at_the_latest_version_of_its_last_line_for_every_command() -> None:
    # The last seq of run 1 in two versions that differ: step 1 at 160, step 2 at
    # 150 (the one put last by the versions' order). The stop's time, the run's
    # span in the report and an open try's end are all 160.
    a = make_run(1, 90.0, [(100.0, disp(1, 0)), (111.0, snapshot(1, "/s", captured_at=110.0))])
    a.append(msgspec.structs.replace(step(1), run_id=run_id(1), seq=3, time=160.0))
    a.append(msgspec.structs.replace(step(2), run_id=run_id(1), seq=3, time=150.0))
    b = make_run(2, 200.0, [(201.0, restore("/s", 1)), (202.0, restored(1))])
    ts = rt.analyze(a + b)
    [stop] = ts.stops
    assert stop.stop_time == 160.0
    assert ts.health().runs[0].last_time == 160.0
    [try_] = ts.timeline().runs[0].attempts
    assert try_.open and try_.end == 160.0
    assert stop.thrown_away_s == 60.0
