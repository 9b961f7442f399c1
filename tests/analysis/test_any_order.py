"""A trace set is a set: no order of files or lines, and no split of a run, changes a figure.

Also what the analysis says beside the figures: stops of an unknown run,
notes, and figures that overflow.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest
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
    write,
)

import rollout_trace as rt
from rollout_trace._cli.main import main
from rollout_trace._model.traceset import Builder, analyze

# Two long runs: A dispatches and seals thousands of tries (more than any
# window a reorder buffer could hold), publishes snapshots, and stops with
# tries open; B restores the last snapshot, resumes some tries and restarts
# the rest. Its figures are computed by hand below.
SIBLINGS = 6000


def _long_stop() -> tuple[list[rt.Event], list[rt.Event]]:
    body: list[tuple[float, rt.Event]] = []
    t = 1000.0
    for i in range(SIBLINGS):
        body.append((t, disp(i, 0)))
        t += 0.01
        if i % 10 != 9:  # every tenth try is still open at the stop
            body.append((t, seal(i, 0)))
            t += 0.01
        if i % 1000 == 999:
            body.append((t, step(i // 1000)))
            body.append((t, snapshot(i // 1000, f"/s/{i // 1000}", captured_at=t - 0.5)))
            t += 0.01
    body.append((t + 1.0, rt.WeightsSynced(weight_version=7)))
    a = make_run(1, 900.0, body)
    b_body: list[tuple[float, rt.Event]] = [
        (t + 60.0, restore(f"/s/{SIBLINGS // 1000 - 2}", SIBLINGS // 1000 - 2)),
        (t + 65.0, restored(SIBLINGS // 1000 - 2)),
    ]
    for i in range(9, SIBLINGS, 20):  # half of the open tries resumed
        b_body.append((t + 66.0, resume(i, 0)))
    return a, make_run(2, t + 50.0, b_body)


def _expected(a: list[rt.Event]) -> dict[str, Any]:
    stop_time = a[-1].time
    starts = {ev.prompt_id: ev.time for ev in a if isinstance(ev, rt.AttemptDispatched)}
    seals = {ev.prompt_id: ev.time for ev in a if isinstance(ev, rt.AttemptSealed)}
    path = f"/s/{SIBLINGS // 1000 - 2}"
    [c] = [ev.captured_at for ev in a if isinstance(ev, rt.SnapshotPublished) and ev.path == path]
    open_ = [i for i in range(9, SIBLINGS, 10)]
    restarted = [i for i in open_ if (i - 9) % 20 != 0]
    resumed = [i for i in open_ if (i - 9) % 20 == 0]
    # Sealed after the capture and not resumed (B resumes open tries only): redone.
    redone = [i for i, t in seals.items() if t > c]
    return {
        "in_flight": len(open_),
        "resumed": len(resumed),
        "resumed_s": math.fsum(stop_time - max(starts[i], c) for i in resumed),
        "restarted": len(restarted),
        "thrown_away_s": math.fsum(stop_time - starts[i] for i in restarted),
        "redone": len(redone),
        "redone_s": math.fsum(seals[i] - starts[i] for i in redone),
    }


@pytest.fixture(scope="module")
def long_stop() -> tuple[list[rt.Event], list[rt.Event]]:
    return _long_stop()


def _stops(paths: list[Path]) -> list[dict[str, Any]]:
    return [s.to_dict() for s in analyze([str(p) for p in paths]).stops]


def _split(events: list[rt.Event], parts: int) -> list[list[rt.Event]]:
    size = -(-len(events) // parts)
    return [events[i : i + size] for i in range(0, len(events), size)]


# Each layout: how the two runs' lines are laid out in files, in the order given.
LAYOUTS = {
    # One file per run, in order: the layout every other one must agree with.
    "in order": lambda a, b, rng: [a, b],
    # A's tail first (rotated or per-process files named out of order): the
    # analysis once lost the stop or its figures here.
    "tail first": lambda a, b, rng: [*reversed(_split(a, 3)), b],
    # Every line of the set in reverse order, in one file.
    "lines reversed": lambda a, b, rng: [list(reversed(a + b))],
    # Every line shuffled, spread over five files.
    "shuffled": lambda a, b, rng: _split(rng.sample(a + b, len(a + b)), 5),
    # The restored run's file before the stopped run's.
    "files reversed": lambda a, b, rng: [b, a],
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_no_order_of_files_or_lines_changes_a_figure(
    long_stop: tuple[list[rt.Event], list[rt.Event]], tmp_path: Path, layout: str
) -> None:
    a, b = long_stop
    files = LAYOUTS[layout](a, b, random.Random(5))
    paths = [write(tmp_path / f"part-{i}.jsonl", part) for i, part in enumerate(files)]
    [stop] = _stops(paths)
    expected = _expected(a)
    assert {k: stop[k] for k in expected} == pytest.approx(expected)
    [reference] = _stops([write(tmp_path / "a.jsonl", a), write(tmp_path / "b.jsonl", b)])
    assert stop == reference


@pytest.mark.parametrize("shuffled", [True, False], ids=["lines-shuffled", "a-run-per-part"])
def test_parts_of_a_set_read_apart_and_merged_give_the_whole(
    long_stop: tuple[list[rt.Event], list[rt.Event]], shuffled: bool
) -> None:
    # What --jobs does: each worker gathers its part, the parent merges them.
    a, b = long_stop
    events = random.Random(3).sample(a + b, len(a) + len(b)) if shuffled else a + b
    whole = Builder()
    whole.add(events)
    merged = Builder()
    for part in _split(events, 4) if shuffled else [a, b]:
        piece = Builder()
        piece.add(part)
        merged.merge(piece)
    got, want = merged.build(), whole.build()
    assert [s.to_dict() for s in got.stops] == [s.to_dict() for s in want.stops]
    assert got.notes == want.notes == []


# --- what the analysis says beside the figures ---------------------------------


def _cost_json(paths: list[Path], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any, str]:
    status = main(["cost", *map(str, paths), "--json"])
    out, err = capsys.readouterr()
    return status, json.loads(out), err


def test_a_restore_with_no_run_before_it_is_a_stop_of_an_unknown_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = make_run(2, 200.0, [(210.0, restore("/s/1", 2)), (215.0, restored(2))])
    status, doc, err = _cost_json([write(tmp_path / "b.jsonl", b)], capsys)
    assert status == 1
    [stop] = doc["stops"]
    assert stop["stopped_run"] is None and stop["restored_run"] == run_id(2)
    assert (stop["restore_s"], stop["restored_step"]) == (5.0, 2)
    unknown = {k for k, v in stop.items() if v is None and k != "stopped_run"}
    assert unknown == {r["figure"] for r in doc["reasons"]}
    assert "in_flight" in unknown and "downtime_s" in unknown
    assert [n["kind"] for n in doc["notes"]] == ["no_stopped_run"]
    assert "no_stopped_run" not in err and "no earlier run" in err
    status = main(["cost", str(tmp_path / "b.jsonl")])
    table = capsys.readouterr().out
    assert status == 1
    assert "unknown run stopped" in table and "n/a: no run before" in table
    assert "no run in the trace set begins with a restore" not in table


def test_a_restore_whose_clock_sorts_before_the_stopped_run_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A's host clock runs 500 s ahead: A seems to open after B, which restores
    # the snapshot A published.
    a = make_run(1, 600.0, [(651.0, snapshot(2, "/s/1", 650.0)), (660.0, disp(1, 0))])
    b = make_run(2, 200.0, [(210.0, restore("/s/1", 2)), (215.0, restored(2))])
    status, doc, _ = _cost_json(
        [write(tmp_path / "a.jsonl", a), write(tmp_path / "b.jsonl", b)], capsys
    )
    assert status == 1
    assert doc["stops"][0]["stopped_run"] is None
    skew, none_before = doc["notes"]
    assert skew["kind"] == "clock_skew" and run_id(1) in skew["text"]
    assert none_before["kind"] == "no_stopped_run"


def _pair(a_body: list[tuple[float, rt.Event]], b_body: list[tuple[float, rt.Event]]) -> Any:
    a = make_run(1, 100.0, [(151.0, snapshot(2, "/s/1", 150.0)), *a_body, (170.0, step(1))])
    b = make_run(2, 200.0, [(210.0, restore("/s/1", 2)), (215.0, restored(2)), *b_body])
    return a, b


# Each row: runs A and B, and the note kinds `cost --json` must carry.
NOTES = [
    pytest.param(
        # B resumes a sibling A had sealed before the capture: A did not have
        # it in flight, and the restored state holds its result.
        _pair([(140.0, disp(1, 0)), (145.0, seal(1, 0))], [(216.0, resume(1, 0))]),
        ["resumed_not_in_flight"],
        id="resumed-not-in-flight",
    ),
    pytest.param(
        # A dispatched prompt 7, B resumes prompt "7": two siblings to the figures.
        _pair([(160.0, disp(7, 0))], [(216.0, resume("7", 0))]),
        ["resumed_not_in_flight", "prompt_id_types"],
        id="prompt-id-7-vs-str-7",
    ),
    pytest.param(
        # B's restore comes at 150, before A's last event at 170.
        (
            make_run(1, 100.0, [(140.0, snapshot(2, "/s/1", 140.0)), (170.0, step(1))]),
            make_run(2, 120.0, [(150.0, restore("/s/1", 2)), (155.0, restored(2))]),
        ),
        ["negative_downtime"],
        id="negative-downtime",
    ),
    pytest.param(
        # B opens at 165, before A's last event, and restores after it.
        (
            make_run(1, 100.0, [(140.0, snapshot(2, "/s/1", 140.0)), (170.0, step(1))]),
            make_run(2, 165.0, [(175.0, restore("/s/1", 2)), (176.0, restored(2))]),
        ),
        ["overlap"],
        id="runs-overlap",
    ),
    pytest.param(
        # B dispatches before it restores: not a stop, and said so.
        (
            make_run(1, 100.0, [(140.0, snapshot(2, "/s/1", 140.0)), (170.0, step(1))]),
            make_run(2, 200.0, [(205.0, disp(1, 0)), (210.0, restore("/s/1", 2))]),
        ),
        ["restore_not_first"],
        id="restore-not-first",
    ),
]


NOTES += [
    pytest.param(
        # A sealed the try after the capture (redone), and B resumes it from
        # the restored state, where it was still running: nothing to note.
        _pair([(149.0, disp(1, 0)), (160.0, seal(1, 0))], [(216.0, resume(1, 0))]),
        [],
        id="redone-then-resumed-is-no-stranger",
    ),
    pytest.param(
        # B's restore_started was lost (a gap): its first rollout event is
        # restore_finished, so no stop is counted, and that is said.
        (
            make_run(1, 100.0, [(140.0, snapshot(2, "/s/1", 140.0)), (170.0, step(1))]),
            make_run(2, 200.0, [(210.0, restored(2)), (220.0, disp(1, 0))]),
        ),
        ["restore_started_missing"],
        id="restore-started-lost",
    ),
    pytest.param(
        # A0 ran before; A, whose clock runs ahead, published what B restored.
        (
            make_run(3, 50.0, [(60.0, disp(9, 0))])
            + make_run(1, 600.0, [(640.0, snapshot(2, "/s/1", 640.0)), (670.0, step(1))]),
            make_run(2, 200.0, [(210.0, restore("/s/1", 2)), (215.0, restored(2))]),
        ),
        ["clock_skew"],
        id="skew-with-an-earlier-run",
    ),
]


@pytest.mark.parametrize(("runs", "kinds"), NOTES)
def test_notes_go_to_json_and_stderr(
    runs: tuple[list[rt.Event], list[rt.Event]],
    kinds: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    a, b = runs
    _, doc, err = _cost_json(
        [write(tmp_path / "a.jsonl", a), write(tmp_path / "b.jsonl", b)], capsys
    )
    assert [n["kind"] for n in doc["notes"]] == kinds
    for note in doc["notes"]:
        assert note["text"] in err


def test_a_run_read_from_two_files_is_noted_and_counted_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = _pair([(160.0, disp(1, 0))], [])
    # Two sinks of one tracer: A's lines in two files, one of them shuffled.
    one = write(tmp_path / "a1.jsonl", a)
    two = write(tmp_path / "a2.jsonl", random.Random(2).sample(a, len(a)))
    _, once, _ = _cost_json([one, write(tmp_path / "b.jsonl", b)], capsys)
    _, twice, _ = _cost_json([one, two, tmp_path / "b.jsonl"], capsys)
    assert twice["stops"] == once["stops"]
    [note] = twice["notes"]
    assert note["kind"] == "read_twice" and f"{len(a):,} event(s)" in note["text"]


def test_times_at_the_edge_of_the_float_range_give_null_figures_not_infinity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = 1.7e308
    # Two tries open from the first seconds of the epoch to a stop near the
    # largest float: each is finite, their sum is not.
    a = make_run(
        1,
        1.0,
        [(2.0, snapshot(2, "/s/1", 2.0)), (3.0, disp(1, 0)), (4.0, disp(2, 0)), (big, step(3))],
    )
    b = make_run(2, big, [(big, restore("/s/1", 2)), (big, restored(2))])
    paths = [write(tmp_path / "a.jsonl", a), write(tmp_path / "b.jsonl", b)]
    status, doc, _ = _cost_json(paths, capsys)
    assert status == 1
    [stop] = doc["stops"]
    assert stop["thrown_away_s"] is None and stop["lost_s"] is None
    assert stop["in_flight"] == 2 and stop["downtime_s"] == 0.0
    reasons = {r["figure"]: r["reason"] for r in doc["reasons"]}
    assert "not a finite number" in reasons["thrown_away_s"]
    main(["cost", *map(str, paths), "--json"])
    text = capsys.readouterr().out
    assert "Infinity" not in text and "NaN" not in text


def test_nothing_restarted_is_zero_point_zero_seconds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = _pair([(160.0, disp(1, 0)), (161.0, abandon(1, 0, 0, "failed"))], [])
    main(["cost", str(write(tmp_path / "a.jsonl", a)), str(write(tmp_path / "b.jsonl", b))])
    capsys.readouterr()
    main(["cost", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--json"])
    text = capsys.readouterr().out
    assert '"thrown_away_s": 0.0' in text


def test_totals_that_overflow_are_na_not_inf(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two stops, each with a finite thrown_away_s near the largest float
    # (1.797e308): 0.95e308, then twice 0.79e308.
    e = 1e308
    runs = [
        make_run(1, 1.0, [(1.5, snapshot(1, "/s/1", 1.5)), (2.0, disp(1, 0)), (0.95 * e, step(3))]),
        make_run(
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
        make_run(3, 1.795 * e, [(1.796 * e, restore("/s/2", 1)), (1.797 * e, restored(1))]),
    ]
    paths = [write(tmp_path / f"r{i}.jsonl", r) for i, r in enumerate(runs)]
    main(["cost", *map(str, paths)])
    table = capsys.readouterr().out
    assert "inf" not in table
    totals = table[table.index("all 2 stop(s)") :]
    assert "thrown_away_s" in totals and "n/a" in totals


def test_an_attempt_number_no_array_holds_is_folded_not_crashed_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # JSON allows any integer; such an attempt stays a live row.
    a, b = _pair([(160.0, disp(1, 0, 2**63)), (161.0, seal(1, 0, 2**63)), (162.0, disp(2, 0))], [])
    status, doc, _ = _cost_json(
        [write(tmp_path / "a.jsonl", a), write(tmp_path / "b.jsonl", b)], capsys
    )
    assert status == 0
    assert doc["stops"][0]["in_flight"] == 1 and doc["stops"][0]["redone"] == 1


def test_a_seq_past_the_limit_is_left_out_in_any_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = _pair([(160.0, disp(1, 0))], [])
    late = rt.WeightsSynced(weight_version=2)
    late.time, late.run_id, late.seq = 9000.0, run_id(1), 2**62
    edge = rt.WeightsSynced(weight_version=1)
    edge.time, edge.run_id, edge.seq = 175.0, run_id(1), 2**62 - 1
    a = [*a, edge, late]
    docs = []
    for name, lines in (("in order", a), ("reversed", list(reversed(a)))):
        _, doc, _ = _cost_json(
            [write(tmp_path / f"{name}.jsonl", lines), write(tmp_path / "b.jsonl", b)], capsys
        )
        docs.append(doc)
    assert docs[0] == docs[1]
    assert docs[0]["stops"][0]["stop_time"] == 175.0
    assert [n["kind"] for n in docs[0]["notes"]] == ["bad_seq"]


def test_merging_keeps_the_parts_as_they_were_and_a_part_merged_twice_counts_once(
    long_stop: tuple[list[rt.Event], list[rt.Event]],
) -> None:
    a, b = long_stop
    part = Builder()
    part.add(a, "a.jsonl")
    before = [s.to_dict() for s in part.build().stops], len(part.build().runs[0].events)
    total = Builder()
    total.merge(part)
    rest = Builder()
    rest.add(b, "b.jsonl")
    total.merge(rest)
    total.merge(part)  # the same part again: a run read twice
    assert ([s.to_dict() for s in part.build().stops], len(part.build().runs[0].events)) == before
    whole = Builder()
    whole.add(a + b)
    got = total.build()
    assert [s.to_dict() for s in got.stops] == [s.to_dict() for s in whole.build().stops]
    assert [n.kind for n in got.notes] == ["read_twice"]


# --- conflicting copies: two lines of one (run_id, seq) that differ --------------------

# Run A stops with sibling 2 open; B restores A's snapshot /s/1 (captured at
# 148) and restarts sibling 2. Sibling 1 is sealed before the capture,
# sibling 3 after it (redone). Seqs: 1 disp 1, 2 seal 1, 3 disp 2, 4 snapshot, 5 disp
# 3, 6 seal 3, 7 step 3, 8 weights_synced (A's last event).
_A = make_run(
    1,
    100.0,
    [
        (140.0, disp(1, 0)),
        (145.0, seal(1, 0)),
        (149.0, disp(2, 0)),
        (150.0, snapshot(2, "/s/1", 148.0)),
        (155.0, disp(3, 0)),
        (160.0, seal(3, 0)),
        (170.0, step(3)),
        (175.0, rt.WeightsSynced(weight_version=2)),
    ],
)
_B = make_run(2, 200.0, [(210.0, restore("/s/1", 2)), (215.0, restored(2))])


def _at(events: list[rt.Event], seq: int, ev: rt.Event | None = None, **fields: Any) -> list[Any]:
    """``events`` with the line of ``seq`` replaced by ``ev`` (given its envelope) or changed."""
    held = events[seq]
    new = held if ev is None else msgspec.structs.replace(ev, run_id=held.run_id, seq=seq)
    new = msgspec.structs.replace(new, **({"time": held.time} | fields))
    return [*events[:seq], new, *events[seq + 1 :]]


# Each row: the files of a trace set that holds conflicting copies of a line
# (A, A changed, ...), and the seqs of run A whose lines differ.
CONFLICTS = [
    pytest.param(
        # seq 2 seals sibling 1 in one copy and is a weight sync in the other:
        # sibling 1 is in flight at the stop or not, by which file came first.
        [_A, _at(_A, 2, rt.WeightsSynced(weight_version=3))],
        [2],
        id="seal-or-sync",
    ),
    pytest.param(
        # A's last event at another time: stop_time, downtime and thrown_away_s.
        [_A, _at(_A, 8, time=190.0)],
        [8],
        id="last-event-time",
    ),
    pytest.param(
        # The open try dispatched at another time: thrown_away_s.
        [_A, _at(_A, 3, time=120.0)],
        [3],
        id="dispatch-time",
    ),
    pytest.param(
        # Sibling 3 sealed as another attempt: in flight (its attempt 0 never
        # ended) or redone.
        [_A, _at(_A, 6, seal(3, 0, 1))],
        [6],
        id="seal-of-another-attempt",
    ),
    pytest.param(
        # The snapshot captured at another time: which seals are redone.
        [_A, _at(_A, 4, captured_at=165.0)],
        [4],
        id="snapshot-captured-at",
    ),
    pytest.param(
        # Step 3 numbered 1 in the copy: lost_steps.
        [_A, _at(_A, 7, step=1)],
        [7],
        id="step-number",
    ),
    pytest.param(
        # B restores another path in one copy of its run: the stop's capture.
        [_A, _B, _at(_B, 1, path="/s/2")],
        [1],
        id="restore-path",
    ),
    pytest.param(
        # Three versions of A's last event, one a file.
        [_A, _at(_A, 8, time=180.0), _at(_A, 8, time=190.0)],
        [8],
        id="three-versions",
    ),
    pytest.param(
        # Two writers that drew one run id: every line after trace_opened
        # differs (sibling 2's dispatch at the same seq as A's seal...).
        [_A, make_run(1, 100.0, [(130.0 + i, disp(10 + i, 0)) for i in range(8)])],
        list(range(1, 9)),
        id="two-writers",
    ),
]


def _conflict_set(tmp_path: Path, files: list[list[Any]]) -> list[Path]:
    """The files, each its own, and B's unless a row gives it."""
    if not any(ev.run_id == run_id(2) for f in files for ev in f):
        files = [*files, _B]
    return [write(tmp_path / f"f{i}.jsonl", f) for i, f in enumerate(files)]


@pytest.mark.parametrize(("files", "seqs"), CONFLICTS)
def test_conflicting_copies_give_the_same_figures_and_note_in_any_order_of_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], files: list[list[Any]], seqs: list[int]
) -> None:
    paths = _conflict_set(tmp_path, files)
    answers = []
    for order in (paths, paths[::-1], [paths[1], paths[0], *paths[2:]]):
        status, doc, err = _cost_json(order, capsys)
        answers.append((status, doc))
        assert status == 1, err
        conflicting = [n for n in doc["notes"] if n["kind"] == "conflicting_copies"]
        assert len(conflicting) == 1, doc["notes"]
        [note] = conflicting
        assert note["text"] in err
        stated = f"seq {seqs[0]}" if len(seqs) == 1 else f"seqs {seqs[0]}-{seqs[-1]}"
        assert stated in note["text"], note["text"]
    assert answers[1] == answers[0] and answers[2] == answers[0]


@pytest.mark.parametrize(("files", "seqs"), CONFLICTS)
def test_conflicting_copies_draw_the_same_timeline_in_any_order_of_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], files: list[list[Any]], seqs: list[int]
) -> None:
    paths = _conflict_set(tmp_path, files)
    drawn = []
    for i, order in enumerate((paths, paths[::-1])):
        out = tmp_path / f"t{i}.json"
        assert main(["timeline", *map(str, order), "-o", str(out)]) == 0
        assert "conflicting" in capsys.readouterr().err
        drawn.append(out.read_bytes())
    assert drawn[1] == drawn[0]


@pytest.mark.parametrize(("files", "seqs"), CONFLICTS)
def test_conflicting_copies_give_the_same_figures_in_any_order_of_lines(
    tmp_path: Path, files: list[list[Any]], seqs: list[int]
) -> None:
    # Every line of the set, shuffled and dealt into one to three files: the
    # fold alone (no second read) keeps the same versions whatever comes first.
    (tmp_path / "ref").mkdir()
    paths = _conflict_set(tmp_path / "ref", files)
    reference = _stops(paths)
    every = [ev for p in paths for ev in rt.read(str(p))]
    rng = random.Random(7)
    for trial in range(12):
        shuffled = rng.sample(every, len(every))
        parts = _split(shuffled, 1 + trial % 3)
        layout = [write(tmp_path / f"{trial}-{i}.jsonl", part) for i, part in enumerate(parts)]
        assert _stops(layout) == reference, trial


def test_a_conflicting_copy_within_one_file_is_noted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # seq 8 twice in A's one file, at two times: in either order of the lines.
    answers = []
    for name, extra in (("later", 190.0), ("earlier", 100.5)):
        a = [*_A, _at(_A, 8, time=extra)[8]]
        for lines_ in (a, a[::-1]):
            path = write(tmp_path / f"{name}.jsonl", lines_)
            status, doc, _ = _cost_json([path, write(tmp_path / "b.jsonl", _B)], capsys)
            assert status == 1
            first = doc["notes"][0]
            assert first["kind"] == "conflicting_copies" and "seq 8" in first["text"], first
            answers.append(doc["stops"])
    assert answers[0] == answers[1] and answers[2] == answers[3]


def test_two_sinks_of_one_tracer_are_a_copy_not_a_conflict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The README's two-sink setup: x.jsonl and x.jsonl.gz hold the same lines.
    once_paths = [write(tmp_path / "x.jsonl", _A), write(tmp_path / "b.jsonl", _B)]
    status, once, _ = _cost_json(once_paths, capsys)
    assert status == 0
    gz = write(tmp_path / "x.jsonl.gz", _A, gz=True)
    for paths in ([*once_paths, gz], [gz, *once_paths]):
        status, twice, err = _cost_json(paths, capsys)
        assert status == 0, err
        assert twice["stops"] == once["stops"]
        assert [n["kind"] for n in twice["notes"]] == ["read_twice"]
