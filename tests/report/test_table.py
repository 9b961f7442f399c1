"""``rt.attempts`` and ``rollout-trace attempts`` (``_report.table``): a row per attempt."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
from traced import KNOWN, Run, d, sealed, synced, trained, write_runs

import rollout_trace as rt
from rollout_trace._cli.main import main


def _restarted() -> list[Run]:
    # Run A stops with sibling 5 open (killed); run B abandons that try
    # (restart: an end whose start is in A) and seals attempt 1, trained at step 2.
    a = Run(
        [
            (11.0, d(5, 0, 2, "g5")),
            (12.0, rt.SnapshotPublished(step=1, path="/s/1", captured_at=11.5)),
        ]
    )
    b = Run(
        [
            (20.0, rt.RestoreStarted(path="/s/1", step=1)),
            (21.0, rt.RestoreFinished(step=1, unfinished_groups=["g5"])),
            (
                22.0,
                rt.AttemptAbandoned(
                    group_id="g5", prompt_id=5, generation_index=0, attempt=0, reason="restart"
                ),
            ),
            (23.0, d(5, 1, 3, "g5")),
            (25.0, sealed(5, 1, "g5")),
            (26.0, synced(4)),
            (27.0, trained(2, "g5")),
        ]
    )
    return [a, b]


def test_rows_say_what_each_try_did_and_what_the_stop_did_to_it(tmp_path: Path) -> None:
    files = write_runs(tmp_path / "set", _restarted())
    rows = rt.attempts(files)
    got = [
        (r.run, r.attempt, r.started_at, r.ended_at, r.duration_s, r.outcome, r.reason,
         r.weight_version, r.trained_step, r.fate, r.stop)
        for r in rows
    ]  # fmt: skip
    assert got == [
        # A's try, open at the stop: B restarted it (its work was thrown away).
        (1, 0, 11.0, None, None, "unended", None, 2, None, "restarted", 1),
        # B's end of A's try: no start in B.
        (2, 0, None, 22.0, None, "abandoned_restart", "restart", None, None, None, 0),
        (2, 1, 23.0, 25.0, 2.0, "sealed", None, 3, 2, None, 0),
    ]
    assert {r.run_id for r in rows if r.run == 1} != {r.run_id for r in rows if r.run == 2}


def test_a_resumed_try_sealed_after_the_capture_is_marked_with_its_lost_part(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A seals sibling 5 at 14, after the capture at 12.5; B resumes it from the
    # captured turns: fate resumed (not redone), losing 12.5 to 14. Sibling 6,
    # open at the stop and not resumed, is restarted: 13 to the stop at 15.
    a = Run(
        [
            (10.0, d(5, 0, 2, "g5")),
            (13.0, d(6, 0, 2, "g6")),
            (13.5, rt.SnapshotPublished(step=1, path="/s/1", captured_at=12.5)),
            (14.0, sealed(5, 0, "g5")),
            (15.0, synced(3)),
        ]
    )
    b = Run(
        [
            (20.0, rt.RestoreStarted(path="/s/1", step=1)),
            (21.0, rt.AttemptResumed(group_id="g5", prompt_id=5, generation_index=0, attempt=0,
                                     turn=2)),
            (22.0, rt.RestoreFinished(step=1, unfinished_groups=["g5"])),
        ]
    )  # fmt: skip
    files = write_runs(tmp_path / "set", [a, b])
    out = tmp_path / "attempts.csv"
    assert main(["attempts", *map(str, files), "-o", str(out)]) == 0
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[-3:] == ["fate", "stop", "lost_s"]
    assert [(r["run"], r["prompt_id"], r["fate"], r["stop"], r["lost_s"]) for r in rows] == [
        ("1", "5", "resumed", "1", "1.5"),
        ("1", "6", "restarted", "1", "2.0"),
        ("2", "5", "", "0", ""),
    ]
    [stop] = rt.restore_costs(rt.read(files))
    assert (stop.resumed, stop.resumed_s, stop.redone, stop.lost_s) == (1, 1.5, 0, 3.5)


def test_csv_has_a_row_per_attempt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = write_runs(tmp_path / "set", [Run(KNOWN)])
    out = tmp_path / "attempts.csv"
    assert main(["attempts", *map(str, files), "-o", str(out)]) == 0
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    # KNOWN holds 7 tries: 1 twice, 2 once, 3 three times, 4 once.
    assert len(rows) == 7
    assert [(r["prompt_id"], r["attempt"], r["outcome"]) for r in rows] == [
        ("1", "0", "failed"),
        ("2", "0", "sealed"),
        ("1", "1", "sealed"),
        ("3", "0", "failed"),
        ("3", "1", "failed"),
        ("3", "2", "sealed"),
        ("4", "0", "unended"),
    ]
    assert rows[1]["trained_step"] == "1" and rows[1]["duration_s"] == "4.0"
    assert rows[6]["ended_at"] == "" and rows[6]["trained_step"] == ""
    assert "7 attempts" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("prompts", "arrow_type", "values"),
    [
        # All ints: an integer column.
        ((1, 2), "int64", [1, 2]),
        # All strs: a string column.
        (("a", "7"), "string", ["a", "7"]),
        # Both (7 and "7" are two siblings): each one's JSON text.
        ((7, "7"), "string", ["7", '"7"']),
        # An int past int64 (a 64-bit hash): each one's JSON text, not a crash.
        ((2**63, 1), "string", ["9223372036854775808", "1"]),
    ],
)
def test_parquet_keeps_the_prompt_ids_apart(
    tmp_path: Path, prompts: tuple[int | str, int | str], arrow_type: str, values: list[object]
) -> None:
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is the parquet extra")
    timed: list[tuple[float, rt.Event]] = []
    for i, p in enumerate(prompts):
        timed += [
            (10.0 + i, rt.AttemptDispatched(group_id="g", prompt_id=p, generation_index=0,
                                            attempt=0, weight_version=1)),
            (20.0 + i, rt.AttemptSealed(group_id="g", prompt_id=p, generation_index=0,
                                        attempt=0)),
        ]  # fmt: skip
    files = write_runs(tmp_path / "set", [Run(timed)])
    out = tmp_path / "attempts.parquet"
    assert main(["attempts", *map(str, files), "-o", str(out)]) == 0
    table = pq.read_table(out)
    assert table.num_rows == 2
    assert str(table.schema.field("prompt_id").type) == arrow_type
    assert table.column("prompt_id").to_pylist() == values
    assert table.column("duration_s").to_pylist() == [10.0, 10.0]
    # CSV keeps them apart the same way.
    csv_out = tmp_path / "attempts.csv"
    assert main(["attempts", *map(str, files), "-o", str(csv_out)]) == 0
    with csv_out.open(newline="") as f:
        got = [row["prompt_id"] for row in csv.DictReader(f)]
    assert got == [str(v) for v in values]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attempts.csv", "attempts.parquet", "set"]


def test_a_parquet_write_that_fails_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pa = pytest.importorskip("pyarrow", reason="pyarrow is the parquet extra")
    files = write_runs(tmp_path / "set", [Run(KNOWN)])

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(pa, "table", broken)
    out = tmp_path / "attempts.parquet"
    assert main(["attempts", *map(str, files), "-o", str(out)]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["set"]


@pytest.mark.parametrize(
    ("output", "words"),
    [
        # The suffix decides the kind.
        ("attempts.txt", "suffix '.txt'"),
        # Writing over a trace file read (one named .csv) would destroy it.
        ("trace.csv", "is one of the trace files read"),
    ],
)
def test_wrong_outputs_are_refused_before_reading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], output: str, words: str
) -> None:
    [written] = write_runs(tmp_path / "set", [Run(KNOWN)])
    trace = tmp_path / "trace.csv"
    trace.write_bytes(written.read_bytes())
    before = trace.read_bytes()
    assert main(["attempts", str(trace), "-o", str(tmp_path / output)]) == 2
    assert words in capsys.readouterr().err
    assert trace.read_bytes() == before


def test_parquet_without_pyarrow_says_what_to_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    files = write_runs(tmp_path / "set", [Run(KNOWN)])
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import fails as if not installed
    assert main(["attempts", *map(str, files), "-o", str(tmp_path / "a.parquet")]) == 2
    assert "pip install 'rollout-trace[parquet]'" in capsys.readouterr().err
