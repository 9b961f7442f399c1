"""``rollout-trace validate``: every rule of the README's Reference, one bad trace each.

The rules live in ``rollout_trace._model.checks``; these run them as a user
does, through the command line, and read its findings and verdict.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
from scenario import abandon, disp, lines, make_run, refuse, resume, run_id, seal, snapshot

import rollout_trace as rt
from rollout_trace._cli.main import main
from rollout_trace._reading import reader
from rollout_trace._reading.gunzip import Cut

T0 = 1_780_000_000.0  # 2026, in Unix seconds
RID = run_id(5)
SIB = f"run {RID}, sibling (prompt_id 1, generation_index 0)"  # as protocol findings name it
CLEAN = make_run(5, T0, [(T0 + 1, disp(1, 0)), (T0 + 2, seal(1, 0))], closed=T0 + 3)


def _line(**fields: object) -> bytes:
    return msgspec.json.encode(
        {"event": "weights_synced", "time": T0 + 1.5, "run_id": RID} | fields
    )


def _with_line(extra: bytes) -> bytes:
    # CLEAN with one more line before trace_closed, and trace_closed counting it.
    closed = msgspec.structs.replace(CLEAN[-1], emitted=3, written=3, seq=4)
    return lines(CLEAN[:-1]) + extra + b"\n" + lines([closed])


CONSEQUENCES = [
    f"error: run {RID}: seq gap: 1 seq(s) missing (3)",
    f"error: run {RID}: trace_closed says written=3 but the trace set holds 2",
]


def _replace_closed(**counts: int) -> bytes:
    return lines([*CLEAN[:-1], msgspec.structs.replace(CLEAN[-1], **counts)])


def _run(*events: rt.Event, start: float = T0, closed: bool = True) -> bytes:
    """A run of 5 with ``events`` one second apart after trace_opened, closed after them."""
    timed = [(start + i, ev) for i, ev in enumerate(events, 1)]
    end = start + len(events) + 1 if closed else None
    return lines(make_run(5, start, timed, closed=end))


def _replace(ev: rt.Event, **fields: object) -> rt.Event:
    return msgspec.structs.replace(ev, **fields)


VALIDATE = [
    # A clean run: valid, nothing reported.
    pytest.param(lines(CLEAN), 0, [], id="valid"),
    # Not JSON: the line cannot be charged to a run, so its seq shows as a gap
    # and trace_closed's written count as one more than the run's lines.
    pytest.param(_with_line(b"{not json"), 1, ["4: error: not JSON", *CONSEQUENCES], id="not-json"),
    # The envelope lacks seq (which the Event class defaults, so the reader
    # must check for it), with the same consequences.
    pytest.param(
        _with_line(_line(weight_version=1)),
        1,
        ["4: error: bad envelope: Object missing required field `seq`", *CONSEQUENCES],
        id="missing-seq",
    ),
    # A field of the wrong type.
    pytest.param(
        _with_line(_line(seq=3, weight_version="one")),
        1,
        ["4: error: bad 'weights_synced' event"],
        id="wrong-type",
    ),
    # A run_id that is not 32 lowercase hex chars.
    pytest.param(
        lines(CLEAN) + _line(run_id="R1", seq=0, weight_version=1) + b"\n",
        1,
        ["5: error: run_id 'R1'", "error: run R1: no trace_opened", "warning: run R1: no trace_c"],
        id="bad-run-id",
    ),
    # seq 2 twice in one file, the second line another event than the first
    # (the seal): a duplicate, and a conflicting copy of the seq.
    pytest.param(
        _with_line(_line(seq=2, weight_version=1)),
        1,
        [
            "4: error: duplicate seq 2",
            f"4: error: run {RID}, seq 2: this weights_synced differs from the line at ",
            f"error: run {RID}: seq gap: 1 seq(s) missing (3)",
            f"error: run {RID}: trace_closed says written=3",
        ],
        id="duplicate-seq",
    ),
    # The same line twice in one file: a duplicate, and no conflict.
    pytest.param(
        _with_line(msgspec.json.encode(CLEAN[2])),
        1,
        [
            "4: error: duplicate seq 2",
            f"error: run {RID}: seq gap: 1 seq(s) missing (3)",
            f"error: run {RID}: trace_closed says written=3",
        ],
        id="duplicate-seq-same-line",
    ),
    # seq 2 missing, and trace_closed does not account for it.
    pytest.param(
        lines(CLEAN[:2] + CLEAN[3:]),
        1,
        [f"error: run {RID}: seq gap: 1 seq(s) missing (2)", "says written=2 but"],
        id="seq-gap",
    ),
    # seq 2 missing, and trace_closed counts one dropped event: a warning.
    pytest.param(
        lines([*CLEAN[:2], msgspec.structs.replace(CLEAN[3], emitted=2, written=1, dropped=1)]),
        0,
        [f"warning: run {RID}: seq gap: 1 seq(s) missing (2), as many as"],
        id="seq-gap-accounted",
    ),
    # No trace_closed: a killed run, only a warning.
    pytest.param(
        lines(CLEAN[:-1]), 0, [f"warning: run {RID}: no trace_closed"], id="no-trace-closed"
    ),
    # A torn last line: a warning, as README > Reference > Wire format says readers must expect it.
    pytest.param(
        lines(CLEAN[:-1]) + b'{"event":"trace_cl',
        0,
        ["4: warning: torn last line", "warning: run " + RID + ": no trace_closed"],
        id="torn-last-line",
    ),
    # trace_closed counts that do not add up.
    pytest.param(
        _replace_closed(emitted=5),
        1,
        ["error: run " + RID + ": trace_closed counts do not add up: emitted=5"],
        id="counts-do-not-add-up",
    ),
    # --- numbers and clocks (README: Reference) ---
    # A schema this reader does not know: checked as schema 1, with a warning.
    pytest.param(
        lines([_replace(CLEAN[0], schema=2), *CLEAN[1:]]),
        0,
        ["1: warning: trace_opened says schema 2; this reader knows schema 1"],
        id="schema-2",
    ),
    # A negative time: the reader takes it for no event at all.
    pytest.param(
        lines([*CLEAN[:2], _replace(CLEAN[2], time=-5.0), CLEAN[3]]),
        1,
        ["3: error: bad envelope: time -5.0 is not a positive number"],
        id="negative-time",
    ),
    # Attempts count from 0.
    pytest.param(
        _run(disp(1, 0, -1), seal(1, 0, -1)),
        1,
        ["2: error: attempt -1 is negative", "3: error: attempt -1 is negative"],
        id="negative-attempt",
    ),
    # A sibling's generation_index runs from 0 to size - 1.
    pytest.param(
        _run(disp(1, -2)),
        1,
        ["2: error: generation_index -2 is negative"],
        id="negative-generation-index",
    ),
    # A group's size is how many generations it has.
    pytest.param(
        _run(rt.GroupReserved(group_id="g", prompt_id=1, size=-3, weight_version=0)),
        1,
        ["2: error: size -3 is negative"],
        id="negative-size",
    ),
    # trace_closed's counts count events: they add up here, yet one is negative.
    pytest.param(
        _replace_closed(emitted=1, written=2, dropped=-1),
        1,
        ["4: error: dropped -1 is negative"],
        id="negative-count",
    ),
    # Times of a monotonic clock: one warning for the run, not one per line.
    pytest.param(
        _run(disp(1, 0), seal(1, 0), start=100.0),
        0,
        [f"warning: run {RID}: 4 event time(s) are not Unix seconds, e.g. 100.0 at"],
        id="monotonic-times",
    ),
    # Times in milliseconds.
    pytest.param(
        _run(disp(1, 0), start=T0 * 1000),
        0,
        [f"warning: run {RID}: 3 event time(s) are not Unix seconds, e.g. 1780000000000.0"],
        id="millisecond-times",
    ),
    # captured_at from a monotonic clock while the times are Unix seconds.
    pytest.param(
        _run(snapshot(1, "/s", 12_345.5)),
        1,
        ["2: error: captured_at 12345.5 looks like a monotonic clock"],
        id="captured-at-monotonic",
    ),
    # captured_at in milliseconds.
    pytest.param(
        _run(snapshot(1, "/s", (T0 + 0.5) * 1000)),
        1,
        ["2: error: captured_at 1780000000500.0 looks like milliseconds"],
        id="captured-at-milliseconds",
    ),
    # A negative captured_at.
    pytest.param(
        _run(snapshot(1, "/s", -1.0)), 1, ["2: error: captured_at -1.0 is negative"], id="neg-cap"
    ),
    # captured_at 30 s after the line that published it (the capturing host's
    # clock ahead): a warning, as the restore-cost figures judge a stop by it.
    pytest.param(
        _run(snapshot(1, "/s", T0 + 31.0)),
        0,
        ["2: warning: captured_at 1780000031.0 is 30.000 s after the event's time"],
        id="captured-after-published",
    ),
    # Captured at the very time it is published: fine.
    pytest.param(_run(snapshot(1, "/s", T0 + 1.0)), 0, [], id="captured-as-published"),
    # captured_at on the same clock as the times (a tracer's clock=): only the
    # run's clock warning.
    pytest.param(
        _run(snapshot(1, "/s", 100.5), start=100.0),
        0,
        [f"warning: run {RID}: 3 event time(s) are not Unix seconds"],
        id="captured-at-same-clock",
    ),
    # --- the attempt protocol (README: Instrumenting a controller) ---
    # Retries with the next number after a failure, a refusal; a restored try
    # resumed and sealed; one started over (restart) and dispatched with the
    # next number; two tries of one sibling at once (hedging); 7 and "7" are
    # two siblings.
    pytest.param(
        _run(
            disp(1, 0, 0),
            abandon(1, 0, 0),
            disp(1, 0, 1),
            refuse(1, 0, 1),
            disp(1, 0, 2),
            disp(1, 0, 3),
            seal(1, 0, 3),
            resume(2, 0, 4),
            seal(2, 0, 4),
            abandon(3, 1, 2, reason="restart"),
            disp(3, 1, 3),
            disp(7, 0),
            disp("7", 0),
        ),
        0,
        [],
        id="protocol-followed",
    ),
    # The same attempt dispatched twice with no end in between.
    pytest.param(
        _run(disp(1, 0), disp(1, 0)),
        1,
        [f"3: error: {SIB}: attempt 0 dispatched again while it is open (at "],
        id="dispatched-while-open",
    ),
    # A resumed try dispatched again under its number.
    pytest.param(
        _run(resume(1, 0, 2), disp(1, 0, 2)),
        1,
        [f"3: error: {SIB}: attempt 2 dispatched after attempt_resumed of the same attempt"],
        id="dispatched-after-resume",
    ),
    # ... even after it ended.
    pytest.param(
        _run(resume(1, 0, 2), abandon(1, 0, 2), disp(1, 0, 2)),
        1,
        [f"4: error: {SIB}: attempt 2 dispatched after attempt_resumed"],
        id="dispatched-after-resume-ended",
    ),
    # Attempt numbers going back.
    pytest.param(
        _run(disp("p", 3, 1), abandon("p", 3, 1), disp("p", 3, 0)),
        1,
        [
            f"4: error: run {RID}, sibling (prompt_id 'p', generation_index 3): attempt numbers "
            "go back: "
            "attempt 0 dispatched after attempt 1 started"
        ],
        id="attempt-goes-back",
    ),
    # A retry under the number of the try it follows; a warning, since a
    # later epoch's new group of the same prompt numbers its tries from 0 too.
    pytest.param(
        _run(disp(1, 0), abandon(1, 0), disp(1, 0)),
        0,
        [f"4: warning: {SIB}: attempt 0 dispatched again after it ended (at "],
        id="retry-reuses-number",
    ),
    # After a restore, a try started over is dispatched with the next number.
    pytest.param(
        _run(abandon(1, 0, 2, reason="restart"), disp(1, 0, 2)),
        0,
        [f"3: warning: {SIB}: attempt 2 dispatched again after it ended"],
        id="restart-reuses-number",
    ),
]


@pytest.mark.parametrize(("data", "status", "expected"), VALIDATE)
def test_validate(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    data: bytes,
    status: int,
    expected: list[str],
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(data)
    assert main(["validate", str(path)]) == status
    *findings, verdict = capsys.readouterr().out.splitlines()
    assert len(findings) == len(expected), findings
    assert all(f.startswith(f"{path}:") for f in findings), findings
    for want in expected:
        assert sum(want in f for f in findings) == 1, (want, findings)
    assert verdict.startswith("valid" if status == 0 else "not valid")


# A file that is no trace gets one finding, naming its first bad line, not one a line.
NOT_A_TRACE = [
    # Plain text.
    pytest.param(b"hello\nworld\n", "2 line(s) is an event; line 1: not JSON", id="text"),
    # Plain text without a final newline: a torn last line alone is only a
    # warning, but no line of the file is an event.
    pytest.param(
        b"hello world", "1 line(s) is an event; line 1: torn last line", id="text-no-newline"
    ),
    # A file of NUL bytes (preallocated blocks after a crash, or a binary).
    pytest.param(b"\0" * 1000, "1 line(s) is an event; line 1: torn last line", id="nuls"),
    # Empty lines only.
    pytest.param(b"\n\n", "2 line(s) is an event; line 1: empty line", id="blank-lines"),
    # Random bytes.
    pytest.param(
        bytes(random.Random(7).getrandbits(8) for _ in range(3000)).replace(b"\n", b"\r") + b"\n",
        "1 line(s) is an event; line 1: not JSON",
        id="binary",
    ),
    # The log of another program, in JSON Lines: 216 lines, one verdict.
    pytest.param(
        b"".join(b'{"level": "info", "msg": "step %d"}\n' % i for i in range(216)),
        "216 line(s) is an event; line 1: bad envelope",
        id="other-jsonl",
    ),
]


@pytest.mark.parametrize(("data", "expected"), NOT_A_TRACE)
def test_a_file_that_is_no_trace_is_not_valid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: bytes, expected: str
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(data)
    assert main(["validate", str(path)]) == 1
    *findings, verdict = capsys.readouterr().out.splitlines()
    assert len(findings) == 1, findings
    assert findings[0].startswith(f"{path}: error: not a trace: none of its {expected}"), findings
    assert verdict.startswith("not valid: not a trace: no line of the "), verdict
    assert verdict.endswith(": 1 error(s), 0 warning(s)"), verdict


def test_bad_lines_before_a_trace_s_first_event_are_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Held back until the file shows an event, then given as they came.
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"junk\n" * 3 + lines(CLEAN))
    assert main(["validate", str(path)]) == 1
    *findings, verdict = capsys.readouterr().out.splitlines()
    said = [f.partition(": JSON is")[0] for f in findings]
    assert said == [f"{path}:{i}: error: not JSON" for i in (1, 2, 3)], findings
    assert verdict.startswith("not valid: ") and "3 error(s)" in verdict, verdict


def test_an_empty_set_is_not_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / name).write_bytes(b"")
    assert main(["validate", str(tmp_path)]) == 1
    *findings, verdict = capsys.readouterr().out.splitlines()
    assert findings == [
        f"{tmp_path / 'a.jsonl'}: error: empty file: no line",
        f"{tmp_path / 'b.jsonl'}: error: empty file: no line",
    ]
    assert verdict == "not valid: not a trace: the 2 file(s) hold no line: 2 error(s), 0 warning(s)"


@pytest.mark.parametrize(
    ("other", "status", "expected"),
    [
        # An empty file next to a trace: a sink whose process died before it
        # wrote; a warning.
        pytest.param(b"", 0, [": warning: empty file: no line"], id="empty"),
        # A log file in the same folder: an error, whatever the other files hold.
        pytest.param(
            b"INFO started\n",
            1,
            [": error: not a trace: none of its 1 line(s) is an event; line 1: not JSON"],
            id="log",
        ),
    ],
)
def test_a_file_is_judged_beside_a_good_trace(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    other: bytes,
    status: int,
    expected: list[str],
) -> None:
    (tmp_path / "a.jsonl").write_bytes(lines(CLEAN))
    (tmp_path / "b.jsonl").write_bytes(other)
    assert main(["validate", str(tmp_path)]) == status
    *findings, _ = capsys.readouterr().out.splitlines()
    assert len(findings) == len(expected), findings
    for want, finding in zip(expected, findings, strict=True):
        assert finding.startswith(f"{tmp_path / 'b.jsonl'}{want}"), (want, finding)


def test_a_run_written_by_two_sinks_is_valid_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The README's two-sink setup: every event of the run in both files.
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / name).write_bytes(lines(CLEAN))
    assert main(["validate", str(tmp_path)]) == 0
    *findings, verdict = capsys.readouterr().out.splitlines()
    assert findings == [
        f"{tmp_path / 'a.jsonl'}: note: run {RID}: read from 2 files: 4 line(s) were events "
        "read already from another file (the same run read twice, e.g. by two file sinks) "
        "and count once"
    ]
    assert verdict == "valid: 8 lines, 1 runs: 0 error(s), 0 warning(s), 1 note(s)"


def test_a_duplicate_within_one_of_two_copies_is_still_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.jsonl").write_bytes(lines(CLEAN))
    (tmp_path / "b.jsonl").write_bytes(lines([*CLEAN[:3], CLEAN[2], CLEAN[3]]))
    assert main(["validate", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    errors = [f for f in out if ": error: " in f]
    assert errors == [
        f"{tmp_path / 'b.jsonl'}:4: error: duplicate seq 2 in run {RID}: this file holds it "
        "already; a seq is used once in a run"
    ]


# A run whose sibling is dispatched twice while open (seqs 1 and 2), with
# lines and files in every order: the finding is the same.
_OPEN_TWICE = make_run(
    5, T0, [(T0 + 1, disp(1, 0)), (T0 + 2, disp(1, 0)), (T0 + 3, seal(1, 0))], closed=T0 + 4
)


@pytest.mark.parametrize(
    "layout",
    [
        [[0, 1, 2, 3, 4]],  # in seq order
        [[4, 3, 2, 1, 0]],  # reversed
        [[3, 4], [0, 1, 2]],  # split in two files, the later part first
        [[2, 4], [0, 3, 1]],  # split and shuffled
    ],
)
def test_the_protocol_is_checked_in_seq_order_whatever_the_order_of_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], layout: list[list[int]]
) -> None:
    paths = []
    for i, seqs in enumerate(layout):
        path = tmp_path / f"{i}.jsonl"
        path.write_bytes(lines(_OPEN_TWICE[s] for s in seqs))
        paths.append(str(path))
    assert main(["validate", *paths]) == 1
    *findings, _ = capsys.readouterr().out.splitlines()
    # seq 2 is the second dispatch, wherever it lies; seq 1 the first.
    place = {s: f"{paths[i]}:{seqs.index(s) + 1}" for i, seqs in enumerate(layout) for s in seqs}
    assert findings == [
        f"{place[2]}: error: {SIB}: attempt 0 dispatched "
        f"again while it is open (at {place[1]}, with no attempt_sealed, attempt_refused or "
        "attempt_abandoned since); expected the try to end first, and a retry to take the "
        "next number"
    ]


def test_huge_seqs_give_their_gaps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    huge = _line(seq=10**8, weight_version=1) + b"\n" + _line(seq=2**62, weight_version=1)
    (tmp_path / "t.jsonl").write_bytes(lines(CLEAN[:3]) + huge + b"\n")
    assert main(["validate", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"seq gap: {2**62 - 4} seq(s) missing (3-99999999, 100000001-{2**62 - 1})" in out


def _sync_at_seal(run: list[rt.Event]) -> list[rt.Event]:
    """``run`` with its seal (seq 2) replaced by a weight sync: a conflicting copy."""
    sync = rt.WeightsSynced(weight_version=3)
    sync.time, sync.run_id, sync.seq = run[2].time, run[2].run_id, 2
    return [*run[:2], sync, *run[3:]]


@pytest.mark.parametrize("changed_first", [False, True], ids=["copy-first", "changed-first"])
def test_lines_of_one_seq_that_differ_are_an_error_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changed_first: bool
) -> None:
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(lines(CLEAN))
    changed = tmp_path / "changed.jsonl"
    changed.write_bytes(lines(_sync_at_seal(CLEAN)))
    first, second = (changed, copy) if changed_first else (copy, changed)
    assert main(["validate", str(first), str(second)]) == 1
    *findings, verdict = capsys.readouterr().out.splitlines()
    tag = "attempt_sealed" if changed_first else "weights_synced"
    assert [f for f in findings if ": error: " in f] == [
        f"{second}:3: error: run {RID}, seq 2: this {tag} differs from the line at {first}:3 "
        "with the same run_id and seq (a conflicting copy: an edited copy, a file torn and "
        "written again, or two writers with one run_id); a seq is used once in a run, and "
        "every copy of a line must be the same"
    ]
    assert f"{first}: note: run {RID}: read from 2 files: 4 line(s) were events " in findings[-1]
    assert findings[-1].endswith(", but for the lines of 1 seq(s) that differ (errors)")
    assert verdict == "not valid: 8 lines, 1 runs: 1 error(s), 0 warning(s), 1 note(s)"


def test_a_third_file_that_repeats_a_version_adds_no_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # CLEAN, its changed copy, and that copy again: one seq, two versions.
    paths = []
    for name, run in (("a", CLEAN), ("b", _sync_at_seal(CLEAN)), ("c", _sync_at_seal(CLEAN))):
        (tmp_path / f"{name}.jsonl").write_bytes(lines(run))
        paths.append(str(tmp_path / f"{name}.jsonl"))
    assert main(["validate", *paths]) == 1
    out = capsys.readouterr().out
    errors = [f for f in out.splitlines() if ": error: " in f]
    assert len(errors) == 1 and errors[0].startswith(f"{paths[1]}:3: error: run {RID}, seq 2:")


def test_versions_of_a_line_are_checked_in_one_order_whatever_came_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # seq 1 dispatches attempt 1 in one copy and attempt 0 in the other: read
    # in arrival order, attempt numbers would go back in one order only.
    one = make_run(5, T0, [(T0 + 1, disp(1, 0, 1)), (T0 + 2, seal(1, 0, 1))], closed=T0 + 3)
    two = [one[0], _replace(one[1], attempt=0), *one[2:]]
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(lines(one))
    b.write_bytes(lines(two))
    protocol = []
    for order in ((a, b), (b, a)):
        assert main(["validate", str(order[0]), str(order[1])]) == 1
        out = capsys.readouterr().out.splitlines()
        assert sum(f"run {RID}, seq 1: this attempt_dispatched differs" in f for f in out) == 1
        protocol.append([f for f in out if "sibling (" in f])
    assert protocol[0] == protocol[1] == []


def test_each_file_is_read_once_even_with_a_conflicting_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The version and the protocol findings come from the one model of the set:
    # no file is read a second time to compare the lines of a seq seen twice.
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(lines(CLEAN))
    b.write_bytes(lines(_sync_at_seal(CLEAN)))
    read: list[str] = []
    chunks = reader._chunks

    def counted(path: str, on_bytes: Callable[[int], None] | None) -> Iterator[bytes | Cut]:
        read.append(path)
        return chunks(path, on_bytes)

    monkeypatch.setattr(reader, "_chunks", counted)
    assert main(["validate", str(a), str(b)]) == 1
    assert read == [str(a), str(b)]
    out = capsys.readouterr().out
    assert (
        f"{b}:3: error: run {RID}, seq 2: this weights_synced differs from the line at {a}:3" in out
    )
