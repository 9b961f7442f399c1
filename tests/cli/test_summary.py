"""``rollout-trace summary``: one name per figure in the table and the JSON, runs read
twice counted once, bounded memory, and what a set of no runs holds."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
from scenario import disp, lines, make_run, run_id, seal

from rollout_trace._cli.main import main
from rollout_trace._reading import reader
from rollout_trace._reading.gunzip import Cut

T0 = 1_780_000_000.0


def _two_runs(tmp_path: Path) -> Path:
    a = make_run(1, T0, [(T0 + 1, disp(1, 0)), (T0 + 2, seal(1, 0))], closed=T0 + 3, pid=41)
    b = make_run(2, T0 + 10, [(T0 + 11, disp(2, 0)), (T0 + 12, seal(2, 0))], pid=42)
    # b misses seq 1, and has a torn last line.
    torn = b'{"event":"attempt_sealed","run_id":"%s","se' % run_id(2).encode()
    data = lines(a) + lines(b[:1]) + lines(b[2:]) + torn
    path = tmp_path / "t.jsonl"
    path.write_bytes(data)
    return path


def test_every_table_column_is_a_key_of_each_json_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _two_runs(tmp_path)
    assert main(["summary", str(path), "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert main(["summary", str(path)]) == 0
    header, _, *rows = capsys.readouterr().out.split("\n\n")[0].splitlines()
    columns = header.split()
    assert len(rows) == len(runs) == 2
    for run, row in zip(runs, rows, strict=True):
        assert set(columns) <= set(run), set(columns) - set(run)
        cells = dict(zip(columns, _cells(row, header), strict=True))
        # The table shows the JSON's values.
        for column in ("run_id", "pid", "events", "missing_seqs", "duplicate_seqs"):
            assert cells[column].replace(",", "") == str(run[column]), column
        for column in ("torn_lines", "invalid_lines"):
            assert cells[column] == str(run[column]), column
        assert cells["closed"] == ("yes" if run["closed"] else "no")
        assert float(cells["span_s"]) == pytest.approx(run["span_s"], abs=0.05)
    assert [r["missing_seqs"] for r in runs] == [0, 1]
    assert [r["torn_lines"] for r in runs] == [0, 1]


def _cells(row: str, header: str) -> list[str]:
    """A table row cut where the header's columns are (times hold spaces)."""
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    ends = [*starts[1:], len(row) + 1]
    return [row[s:e].strip() for s, e in zip(starts, ends, strict=True)]


def test_a_run_written_by_two_sinks_counts_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(3, T0, [(T0 + 1, disp(1, 0)), (T0 + 2, seal(1, 0))], closed=T0 + 3)
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / name).write_bytes(lines(run))
    assert main(["summary", str(tmp_path), "--json"]) == 0
    [summary] = json.loads(capsys.readouterr().out)["runs"]
    assert summary["events"] == 4
    assert summary["events_by_name"] == {
        "attempt_dispatched": 1,
        "attempt_sealed": 1,
        "trace_closed": 1,
        "trace_opened": 1,
    }
    assert (summary["read_twice"], summary["duplicate_seqs"], summary["missing_seqs"]) == (4, 0, 0)
    assert summary["conflicts"] == 0
    assert main(["summary", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"  {run_id(3)}: in 2 files; 4 line(s) repeat events of another file" in out


def test_a_huge_seq_costs_no_memory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rid = run_id(4)
    opened = make_run(4, T0, [])[0]
    events = [
        msgspec.json.encode(
            {"event": "weights_synced", "time": T0, "run_id": rid, "seq": s, "weight_version": 1}
        )
        for s in (1, 2, 10**8, 2**62)
    ]
    path = tmp_path / "t.jsonl"
    path.write_bytes(lines([opened]) + b"".join(line + b"\n" for line in events))
    main(["summary", str(path), "--json"])  # decoders built, modules loaded
    capsys.readouterr()
    tracemalloc.start()
    try:
        assert main(["summary", str(path), "--json"]) == 0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak  # a bitmap to seq 10**8 is 100 MB
    [summary] = json.loads(capsys.readouterr().out)["runs"]
    assert summary["seq_gaps"] == [[3, 10**8 - 1], [10**8 + 1, 2**62 - 1]]
    assert summary["missing_seqs"] == 2**62 - 4


@pytest.mark.parametrize(
    ("data", "read", "stdout", "shown", "more"),
    [
        # 25 lines of a log: the first 10 on stderr, then how many more.
        pytest.param(
            b"".join(b"INFO step %d done\n" % i for i in range(25)),
            25,
            "no runs: 25 lines read from 1 file(s), 25 of them bad; not one line is a trace event",
            10,
            "rollout-trace: ... and 15 more bad line(s) "
            "(rollout-trace validate says where each is)",
            id="log",
        ),
        # A binary of NUL bytes: one line, torn.
        pytest.param(
            b"\0" * 5000,
            1,
            "no runs: 1 lines read from 1 file(s), 1 of them bad (1 torn); not one line is a "
            "trace event",
            1,
            None,
            id="nuls",
        ),
        # An empty file.
        pytest.param(b"", 0, "no runs: the 1 file(s) given hold no line", 0, None, id="empty"),
    ],
)
def test_a_set_of_no_runs_says_what_it_read(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    data: bytes,
    read: int,
    stdout: str,
    shown: int,
    more: str | None,
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(data)
    assert main(["summary", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0] == stdout
    err = captured.err.splitlines()
    assert len(err) == shown + (more is not None), err
    for i, line in enumerate(err[:shown], 1):
        assert line.startswith(f"rollout-trace: {path}:{i}: "), line
    if more is not None:
        assert err[-1] == more
    assert main(["summary", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["runs"], doc["lines"], doc["bad_lines"]) == ([], read, read)
    assert len(doc["unattributed_problems"]) == shown
    assert doc["unattributed_lines"] == doc["bad_lines"]


def test_lines_of_one_seq_that_differ_are_conflicts_counted_alike_in_any_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(3, T0, [(T0 + 1, disp(1, 0)), (T0 + 2, seal(1, 0))], closed=T0 + 3)
    # The copy's seq 2 is a weight sync, later than anything of the run.
    sync = msgspec.json.encode(
        {"event": "weights_synced", "time": T0 + 5, "run_id": run_id(3), "seq": 2}
        | {"weight_version": 3}
    )
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(lines(run))
    b.write_bytes(lines(run[:2]) + sync + b"\n" + lines(run[3:]))
    docs = []
    for order in ([a, b], [b, a]):
        assert main(["summary", *map(str, order), "--json"]) == 0
        [summary] = json.loads(capsys.readouterr().out)["runs"]
        del summary["files"]  # in the order given
        docs.append(summary)
    assert docs[0] == docs[1]
    summary = docs[0]
    assert (summary["conflicts"], summary["conflict_seqs"]) == (1, [[2, 2]])
    # Each version is an event: the seal and the sync.
    assert summary["events"] == 5 and summary["read_twice"] == 4
    assert summary["events_by_name"] == {
        "attempt_dispatched": 1,
        "attempt_sealed": 1,
        "trace_closed": 1,
        "trace_opened": 1,
        "weights_synced": 1,
    }
    assert summary["last_time"] == T0 + 5
    assert main(["summary", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    header, _, row = out.splitlines()[:3]
    assert dict(zip(header.split(), _cells(row, header), strict=True))["conflicts"] == "1"
    assert f"  {run_id(3)}: 1 seq(s): 2" in out


def test_a_seq_twice_in_one_file_with_two_events_is_a_conflict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(3, T0, [(T0 + 1, disp(1, 0)), (T0 + 2, seal(1, 0))])
    again = msgspec.structs.replace(run[2], time=T0 + 4)
    same = msgspec.structs.replace(run[2])
    for extra, conflicts in ((again, 1), (same, 0)):
        path = tmp_path / "t.jsonl"
        path.write_bytes(lines([*run, extra]))
        assert main(["summary", str(path), "--json"]) == 0
        [summary] = json.loads(capsys.readouterr().out)["runs"]
        assert (summary["duplicate_seqs"], summary["conflicts"]) == (1, conflicts)


def test_a_run_read_again_with_a_duplicate_in_the_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The run in a.jsonl, again in b.jsonl, where its seq 1 is twice: each event
    # counts once, the copy's lines are read_twice, the line b repeats a duplicate.
    run = make_run(1, T0, [(T0 + 1, disp(1, 0))], closed=T0 + 2)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(lines(run))
    b.write_bytes(lines([*run, run[1]]))
    assert main(["summary", str(a), str(b), "--json"]) == 0
    [summary] = json.loads(capsys.readouterr().out)["runs"]
    assert (summary["events"], summary["read_twice"], summary["duplicate_seqs"]) == (3, 3, 1)
    assert summary["events_by_name"] == {
        "attempt_dispatched": 1,
        "trace_closed": 1,
        "trace_opened": 1,
    }
    assert summary["files"] == [str(a), str(b)]
    assert summary["conflicts"] == 0


def test_runs_come_in_the_run_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Run 1 opened after run 2, but its clock stepped back: an event of it is the
    # earliest of the set. The runs are listed by trace_opened, as report lists them.
    one = make_run(1, T0 + 10, [(T0 + 1, disp(1, 0))], closed=T0 + 12)
    two = make_run(2, T0 + 5, [(T0 + 6, disp(2, 0))], closed=T0 + 7)
    path = tmp_path / "t.jsonl"
    path.write_bytes(lines(one) + lines(two))
    assert main(["summary", str(path), "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [r["run_id"] for r in runs] == [run_id(2), run_id(1)]
    assert runs[1]["first_time"] == T0 + 1


def test_a_run_that_lost_its_first_lines_has_a_gap_from_seq_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(3, T0, [(T0 + 1, disp(1, 0)), (T0 + 2, seal(1, 0))], closed=T0 + 3)
    path = tmp_path / "t.jsonl"
    path.write_bytes(lines(run[2:]))
    assert main(["summary", str(path), "--json"]) == 0
    [summary] = json.loads(capsys.readouterr().out)["runs"]
    assert (summary["seq_gaps"], summary["missing_seqs"]) == ([[0, 1]], 2)
    assert summary["host"] is None


def test_a_run_of_seqs_no_tracer_gives_comes_last(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A run whose only line has seq 2**62 (corrupt) has no place in the run order,
    # though its time is the earliest; it is listed, after the others.
    run = make_run(1, T0, [(T0 + 1, disp(1, 0))], closed=T0 + 2)
    huge = {"event": "weights_synced", "time": T0 - 5, "run_id": run_id(2), "seq": 2**62}
    path = tmp_path / "t.jsonl"
    path.write_bytes(lines(run) + msgspec.json.encode(huge | {"weight_version": 1}) + b"\n")
    assert main(["summary", str(path), "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [r["run_id"] for r in runs] == [run_id(1), run_id(2)]
    assert (runs[1]["events"], runs[1]["missing_seqs"]) == (1, 2**62)


@pytest.mark.parametrize("argv", [["summary"], ["summary", "--json"]])
def test_each_file_is_read_once_even_with_a_conflicting_copy(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
) -> None:
    # The copy's seq 2 is a weight sync: lines of one seq that differ are told
    # apart as the set is gathered, with no second read of either file.
    run = make_run(3, T0, [(T0 + 1, disp(1, 0)), (T0 + 2, seal(1, 0))], closed=T0 + 3)
    sync = msgspec.json.encode(
        {"event": "weights_synced", "time": T0 + 2, "run_id": run_id(3), "seq": 2}
        | {"weight_version": 3}
    )
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(lines(run))
    b.write_bytes(lines(run[:2]) + sync + b"\n" + lines(run[3:]))
    read: list[str] = []
    chunks = reader._chunks

    def counted(path: str, on_bytes: Callable[[int], None] | None) -> Iterator[bytes | Cut]:
        read.append(path)
        return chunks(path, on_bytes)

    monkeypatch.setattr(reader, "_chunks", counted)
    assert main([*argv, str(a), str(b)]) == 0
    assert read == [str(a), str(b)]
    out = capsys.readouterr().out
    assert "1 seq(s): 2" in out or '"conflicts": 1' in out
