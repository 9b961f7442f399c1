"""The ``rollout-trace`` subcommands: cost, summary, validate; output and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scenario import disp, lines, make_run, restore, restored, run_id, seal, snapshot, write

import rollout_trace as rt
from rollout_trace._cli.main import main
from rollout_trace._model.stops import FIGURES


def _stop_set(tmp_path: Path, *, path: str = "/s/1") -> Path:
    a = make_run(
        1,
        100.0,
        [
            (151.0, snapshot(2, "/s/1", 150.0)),
            (152.0, disp(1, 0)),
            (158.0, seal(1, 0)),
            (160.0, disp(2, 0)),
            (170.0, rt.WeightsSynced(weight_version=1)),
        ],
    )
    b = make_run(2, 200.0, [(210.0, restore(path, 2)), (215.0, restored(2))])
    write(tmp_path / f"run-{run_id(1)}.jsonl", a)
    write(tmp_path / f"run-{run_id(2)}.jsonl.gz", b, gz=True)
    return tmp_path


def test_cost_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _stop_set(tmp_path)
    assert main(["cost", str(folder / "*.jsonl*"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["stops"] == [
        {
            "stopped_run": run_id(1),
            "restored_run": run_id(2),
            "stop_time": 170.0,
            "downtime_s": 40.0,
            "restore_s": 5.0,
            "restored_step": 2,
            "captured_at": 150.0,
            "in_flight": 1,
            "resumed": 0,
            "resumed_s": 0.0,
            "restarted": 1,
            "thrown_away_s": 10.0,
            "redone": 1,
            "redone_s": 6.0,
            "lost_s": 16.0,
            "lost_steps": 0,
            "lost_steps_s": 70.0,
        }
    ]
    assert doc["reasons"] == []


def test_cost_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", str(_stop_set(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert f"run {run_id(1)} stopped; run {run_id(2)} restored '/s/1'" in out
    rows = {line.split()[0]: line.split()[1:3] for line in out.splitlines() if line[:2] == "  "}
    assert rows["lost_s"] == ["16.000", "s"]
    assert rows["in_flight"] == ["1", "siblings"]
    assert "all 1 stop(s)" in out


def test_cost_unknown_figure_exits_1_with_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _stop_set(tmp_path, path="/elsewhere")
    assert main(["cost", str(folder), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["stops"][0]["captured_at"] is None
    figures = {r["figure"] for r in doc["reasons"]}
    assert figures == {"captured_at", "resumed", "resumed_s", "redone", "redone_s", "lost_s"}


@pytest.mark.parametrize(
    "argv",
    [
        ["cost", "--bogus", "x.jsonl"],  # an unknown option
        ["cost", "missing.jsonl"],  # a missing file
        ["summary", "nothing-*.jsonl"],  # a glob that matches nothing
        ["validate"],  # no paths at all
        [],  # no subcommand
    ],
)
def test_wrong_usage_exits_2(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2


@pytest.mark.parametrize("command", ["cost", "summary", "validate"])
def test_help_has_an_example(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert f"rollout-trace {command} " in out.split("examples:")[1]


def test_cost_help_points_at_the_docs_figure_definitions(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["cost", "--help"]) == 0
    out = capsys.readouterr().out
    assert "docs, Reference > Restore-cost figures" in " ".join(out.split())
    assert "SPEC" not in out
    # The section it names is there, in the docs' Reference, and defines every figure.
    reference = (Path(__file__).parents[2] / "docs" / "reference.md").read_text(encoding="utf-8")
    section = reference[reference.index("\n## Restore-cost figures\n") :]
    section = section[: section.index("\n## ", 1)]
    for figure in FIGURES:
        assert f"| `{figure}` |" in section, figure


@pytest.mark.parametrize(
    "command", [[], ["cost"], ["summary"], ["validate"], ["timeline"], ["demo"]]
)
def test_no_help_text_names_a_file_users_do_not_have(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "SPEC" not in out
    assert "the docs" in out or command in (["summary"], ["timeline"], ["demo"])


def test_summary_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(3, 100.0, [(101.0, disp(1, 0)), (102.0, seal(1, 0))], closed=103.0, pid=42)
    data = lines(run[:2] + run[3:]) + b'{"event":"attempt_sealed","run_id":"' + run_id(3).encode()
    (tmp_path / "t.jsonl").write_bytes(data)
    assert main(["summary", str(tmp_path / "t.jsonl"), "--json"]) == 0
    [summary] = json.loads(capsys.readouterr().out)["runs"]
    assert summary == {
        "run_id": run_id(3),
        "files": [str(tmp_path / "t.jsonl")],
        "host": "node-1",
        "pid": 42,
        "first_time": 100.0,
        "last_time": 103.0,
        "span_s": 3.0,
        "events": 3,
        "events_by_name": {"attempt_dispatched": 1, "trace_closed": 1, "trace_opened": 1},
        "seq_gaps": [[2, 2]],
        "missing_seqs": 1,
        "duplicate_seqs": 0,
        "conflicts": 0,
        "conflict_seqs": [],
        "read_twice": 0,
        "torn_lines": 1,
        "invalid_lines": 0,
        "closed": True,
    }


def test_summary_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "t.jsonl", make_run(3, 100.0, [(101.0, disp(1, 0))]))
    assert main(["summary", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    header, _, row = out.splitlines()[:3]
    assert header.split() == [
        "run_id", "host", "pid", "first_time", "last_time", "span_s", "events", "missing_seqs",
        "duplicate_seqs", "conflicts", "torn_lines", "invalid_lines", "closed",
    ]  # fmt: skip
    assert row.split()[0] == run_id(3) and row.split()[-1] == "no"


def test_shipped_example(capsys: pytest.CaptureFixture[str]) -> None:
    # tests/data/make_example.py's plan: a killed run with two tries open (one
    # resumed, one restarted), 13 seals after the snapshot's capture (none of
    # them resumed, so redone), step 4 lost.
    folder = Path(__file__).parents[1] / "data" / "example"
    assert main(["cost", str(folder), "--json"]) == 0
    [stop] = json.loads(capsys.readouterr().out)["stops"]
    counts = {k: stop[k] for k in ("in_flight", "resumed", "restarted", "redone", "lost_steps")}
    assert counts == {"in_flight": 2, "resumed": 1, "restarted": 1, "redone": 13, "lost_steps": 1}
    assert stop["downtime_s"] == pytest.approx(40.0)
    assert stop["restore_s"] == pytest.approx(6.5)
    assert stop["lost_s"] == pytest.approx(
        stop["resumed_s"] + stop["thrown_away_s"] + stop["redone_s"]
    )
    assert main(["validate", str(folder)]) == 0


def test_a_run_read_twice_costs_the_same_as_once(tmp_path: Path) -> None:
    # Two file sinks of one tracer, or a copied file: every event twice.
    import shutil

    example = Path(__file__).parents[1] / "data" / "example"
    copy = tmp_path / "copy"
    shutil.copytree(example, copy)
    once = rt.restore_costs(rt.read(str(example)))
    twice = rt.restore_costs(rt.read([str(example), str(copy)]))
    assert [s.to_dict() for s in twice] == [s.to_dict() for s in once]


def test_a_file_whose_name_looks_like_a_glob_is_read(tmp_path: Path) -> None:
    import shutil

    example = next((Path(__file__).parents[1] / "data" / "example").glob("*.jsonl"))
    odd = tmp_path / "run[1]"
    odd.mkdir()
    shutil.copy(example, odd / "run[1].jsonl")
    for form in (odd / "run[1].jsonl", odd):  # the file itself, its folder
        assert main(["summary", str(form)]) == 0


@pytest.mark.parametrize(
    "time_value",
    [
        1_700_000_000_000.0,  # milliseconds by mistake
        1e20,  # no date at all
    ],
)
def test_times_that_are_not_dates_are_shown_not_crashed_on(
    time_value: float, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ms.jsonl"
    path.write_text(
        json.dumps(
            {
                "event": "trace_opened",
                "time": time_value,
                "run_id": "a" * 32,
                "seq": 0,
                "schema": 1,
                "sdk_version": "0",
                "pid": 1,
                "host": "h",
                "meta": {},
            }
        )
        + "\n"
    )
    assert main(["summary", str(path)]) == 0
    assert "not a date" in capsys.readouterr().out
    assert main(["timeline", str(path), "-o", str(tmp_path / "t.html")]) == 0


def test_a_timeline_json_holds_integers_wider_than_64_bits(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    path.write_text(
        json.dumps(
            {
                "event": "trace_opened",
                "time": 1.7e9,
                "run_id": "b" * 32,
                "seq": 0,
                "schema": 1,
                "sdk_version": "0",
                "pid": 1,
                "host": "h",
                "meta": {"n": 2**80},
            }
        )
        + "\n"
    )
    out = tmp_path / "t.json"
    assert main(["timeline", str(path), "-o", str(out)]) == 0
    assert "traceEvents" in json.loads(out.read_text())


@pytest.mark.parametrize(
    "argv",
    [
        ["cost"],
        ["summary"],
        ["summary", "--json"],
        ["timeline", "-o", "{tmp}/t.html"],
    ],
)
def test_bad_lines_on_stderr_are_the_first_ten_and_a_count(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A trace followed by a binary's worth of bad lines.
    path = tmp_path / "t.jsonl"
    run = make_run(3, 1.78e9, [(1.78e9 + 1, disp(1, 0))], closed=1.78e9 + 2)
    path.write_bytes(lines(run) + b"\x00\x01garbage\n" * 30)
    words = [w.replace("{tmp}", str(tmp_path)) for w in argv]
    assert main([*words, str(path)]) == 0
    err = capsys.readouterr().err.splitlines()
    shown = [line for line in err if line.startswith(f"rollout-trace: {path}:")]
    assert shown == [f"rollout-trace: {path}:{n}: skipped: not JSON: JSON is malformed: "
                     "invalid character (byte 0)" for n in range(4, 14)]  # fmt: skip
    more = [line for line in err if line.startswith("rollout-trace: ...")]
    assert more == ["rollout-trace: ... and 20 more bad line(s) (rollout-trace validate says "
                    "where each is)"]  # fmt: skip


@pytest.mark.parametrize("command", ["cost", "timeline"])
def test_bad_lines_cost_no_memory_however_many(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A text log given by mistake: every line is a bad line. Only the first
    # few are kept to show; the others are counted.
    log = tmp_path / "train.jsonl"
    log.write_bytes(b"".join(b"step %d loss 0.5 lr 1e-4\n" % i for i in range(100_000)))
    args = [command, str(log)] + (["-o", str(tmp_path / "t.json")] if command == "timeline" else [])
    import tracemalloc

    tracemalloc.start()
    try:
        main(args)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    err = capsys.readouterr().err
    assert "99,990 more bad line(s)" in err
    # Keeping every problem took about 40 MB.
    assert peak < 12_000_000, peak


def test_a_timeline_never_overwrites_a_trace_it_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A trace whose name ends in .json: -o naming it is a usage error.
    trace = tmp_path / "trace.json"
    trace.write_bytes(lines(make_run(1, 100.0, [(101.0, disp(1, 0))])))
    before = trace.read_bytes()
    assert main(["timeline", str(trace), "-o", str(trace)]) == 2
    assert "one of the trace files read" in capsys.readouterr().err
    assert trace.read_bytes() == before
