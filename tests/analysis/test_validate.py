"""``rollout-trace validate``: every rule of the README's Reference, one bad trace each.

The rules live in ``rollout_trace._analysis.validate``; these run them as a user
does, through the command line, and read its findings and verdict.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from scenario import disp, lines, make_run, run_id, seal

from rollout_trace._cli.main import main

RID = run_id(5)
CLEAN = make_run(5, 100.0, [(101.0, disp(1, 0)), (102.0, seal(1, 0))], closed=103.0)


def _line(**fields: object) -> bytes:
    return msgspec.json.encode({"event": "weights_synced", "time": 101.5, "run_id": RID} | fields)


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


VALIDATE = [
    # A clean run: valid, nothing reported.
    pytest.param(lines(CLEAN), 0, [], id="valid"),
    # Not JSON.
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
        lines(CLEAN)
        + msgspec.json.encode(
            {"event": "weights_synced", "time": 1.0, "run_id": "R1", "seq": 0, "weight_version": 1}
        )
        + b"\n",
        1,
        ["5: error: run_id 'R1'", "error: run R1: no trace_opened", "warning: run R1: no trace_c"],
        id="bad-run-id",
    ),
    # seq 2 twice.
    pytest.param(
        _with_line(_line(seq=2, weight_version=1)),
        1,
        [
            "4: error: duplicate seq 2",
            f"error: run {RID}: seq gap: 1 seq(s) missing (3)",
            f"error: run {RID}: trace_closed says written=3",
        ],
        id="duplicate-seq",
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
